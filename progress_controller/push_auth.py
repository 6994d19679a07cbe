"""Who is pushing: a projected ServiceAccount token of our audience, checked by TokenReview.

The pod mounts a token the kubelet requests with our audience (`PUSH_AUDIENCE`) and a short
expiry; the API server says in the TokenReview whether it is valid *for that audience* (a token of
the API server's own audience, or of Trainer's, is refused: 401), and which pod it is bound to
(`user.extra["authentication.kubernetes.io/pod-name" / "pod-uid"]`). The caller then binds the push
to that pod (push.py).

Anyone who reaches the port can send a new token each time and each costs the API server a review,
so reviews have a budget of their own (as metrics_auth's): their own client, at most `rate` new
reviews per second (burst `burst`) and `max_in_flight` at once, beyond that 429 at once; answers
cached by a hash of the token (never the token): a valid one until shortly before the token's own
`exp` (so an expired token is never accepted from the cache), a refused one for `negative_ttl`.
Concurrent requests with the same token share one review.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Final

from reconciler.clock import REAL_CLOCK, Clock
from reconciler.errors import KubeError
from reconciler.metrics_auth import TOKEN_REVIEWS, ExpiringCache
from reconciler.ratelimit import TokenBucket

PUSH_AUDIENCE: Final = "kubeckpt-progress"
POD_NAME_EXTRA: Final = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA: Final = "authentication.kubernetes.io/pod-uid"
SA_PREFIX: Final = "system:serviceaccount:"


@dataclass(frozen=True)
class PodIdentity:
    """The pod a valid token is bound to."""

    namespace: str
    service_account: str
    pod_name: str
    pod_uid: str


@dataclass(frozen=True)
class Refusal:
    status: int  # 401, 403, 429, 503
    reason: str


Answer = PodIdentity | Refusal


def token_exp(token: str) -> float | None:
    """The `exp` claim of a JWT, unverified: only ever used to cache a verdict the API server gave
    for no longer than the token lives."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, TypeError):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def identity_of(review: Any, audience: str) -> Answer:
    """The pod a TokenReview's status names, or why the token is refused (pure)."""
    st = (review or {}).get("status") or {}
    if not st.get("authenticated"):
        return Refusal(401, f"the token is not valid for audience {audience!r} (or has expired)")
    if audience not in (st.get("audiences") or []):
        return Refusal(401, f"the token is not for audience {audience!r}")
    user = st.get("user") or {}
    username = str(user.get("username") or "")
    if not username.startswith(SA_PREFIX):
        return Refusal(403, "the token is not a ServiceAccount's")
    namespace, _, sa = username[len(SA_PREFIX) :].partition(":")
    extra = user.get("extra") or {}
    names, uids = extra.get(POD_NAME_EXTRA) or [], extra.get(POD_UID_EXTRA) or []
    if len(names) != 1 or len(uids) != 1 or not namespace or not sa:
        return Refusal(403, "the token is not bound to a pod (use a projected token)")
    return PodIdentity(namespace, sa, str(names[0]), str(uids[0]))


class PushAuth:
    """TokenReviews with our audience, cached and within a budget of their own."""

    def __init__(
        self,
        client: Any,
        *,
        audience: str = PUSH_AUDIENCE,
        max_ttl: float = 300.0,
        expiry_margin: float = 10.0,
        negative_ttl: float = 5.0,
        max_entries: int = 16384,
        rate: float = 20.0,
        burst: int = 50,
        max_in_flight: int = 8,
        review_timeout: float = 5.0,
        clock: Clock = REAL_CLOCK,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.audience = audience
        self.max_ttl = max_ttl
        self.expiry_margin = expiry_margin
        self.negative_ttl = negative_ttl
        self.max_entries = max_entries
        self.max_in_flight = max_in_flight
        self.review_timeout = review_timeout
        self._clock = clock
        self._owns_client = owns_client
        self._budget = TokenBucket(rate, burst, clock)
        # Kept apart, so that a flood of bad tokens cannot push out the good ones.
        self._valid: ExpiringCache[str, Answer] = ExpiringCache(max_entries)
        self._refused: ExpiringCache[str, Answer] = ExpiringCache(max_entries)
        self._pending: dict[str, asyncio.Task[Answer]] = {}
        self.stats = {"reviews": 0, "cached": 0, "joined": 0, "over_budget": 0}

    @classmethod
    def with_own_client(cls, client: Any, **kw: Any) -> PushAuth:
        """Reviews on a client of their own (no share of the controller's rate limit, no
        retries); closed by `close()`."""
        own = client.derived(
            qps=None,
            max_connections=kw.get("max_in_flight", 8),
            max_retries=0,
            user_agent=f"{client.config.user_agent} progress-push-auth",
        )
        return cls(own, owns_client=True, **kw)

    async def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        if self._owns_client:
            await self.client.close()

    def _cached(self, key: str, now: float) -> Answer | None:
        return self._valid.get(key, now) or self._refused.get(key, now)

    def _put(self, key: str, answer: Answer, until: float) -> None:
        cache = self._valid if isinstance(answer, PodIdentity) else self._refused
        cache.put(key, answer, until)

    async def check(self, authorization: str) -> Answer:
        """The pod the request's `Authorization: Bearer` token is bound to, or a Refusal."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Refusal(401, "a bearer token is required")
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cached(key, self._clock.now())
        if hit is not None:
            self.stats["cached"] += 1
            return hit
        task = self._pending.get(key)
        if task is not None:
            self.stats["joined"] += 1
        else:
            if len(self._pending) >= self.max_in_flight or not self._budget.try_take():
                self.stats["over_budget"] += 1
                return Refusal(429, "too many new tokens to check now: retry shortly")
            task = asyncio.create_task(self._resolve(key, token))
            self._pending[key] = task
        return await asyncio.shield(task)

    async def _resolve(self, key: str, token: str) -> Answer:
        try:
            async with asyncio.timeout(self.review_timeout):
                self.stats["reviews"] += 1
                review = await self.client.request(
                    "POST",
                    TOKEN_REVIEWS,
                    json_body={
                        "apiVersion": "authentication.k8s.io/v1",
                        "kind": "TokenReview",
                        "spec": {"token": token, "audiences": [self.audience]},
                    },
                )
        except (KubeError, OSError, TimeoutError) as e:  # not cached: the next push asks again
            return Refusal(503, f"cannot check the token with the API server: {type(e).__name__}")
        finally:
            self._pending.pop(key, None)
        answer = identity_of(review, self.audience)
        now = self._clock.now()
        if isinstance(answer, PodIdentity):
            until = now + self.max_ttl
            exp = token_exp(token)
            if exp is not None:
                # The clock is monotonic: the wall-clock exp becomes a lifetime from now.
                until = min(until, now + (exp - time.time()) - self.expiry_margin)
            if until > now:
                self._put(key, answer, until)
        else:
            self._put(key, answer, now + self.negative_ttl)
        return answer
