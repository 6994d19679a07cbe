"""Who is pushing: a projected ServiceAccount token of our audience, checked by TokenReview.

The pod mounts a token the kubelet requests with our audience (`PUSH_AUDIENCE`) and a short
expiry; the API server says in the TokenReview whether it is valid *for that audience* (a token of
the API server's own audience, or of Trainer's, is refused: 401), and which pod it is bound to
(`user.extra["authentication.kubernetes.io/pod-name" / "pod-uid"]`). The caller then binds the push
to that pod (push.py).

Anyone who reaches the port can send a new token each time and each costs the API server a review,
so reviews have a budget of their own, the engine metrics_auth's uses (reconciler/review_budget.py):
their own client, at most `rate` new reviews per second (burst `burst`) and `max_in_flight` at
once, beyond that 429 at once; answers cached by a hash of the token (never the token): a valid one
until shortly before the token's own `exp` (so an expired token is never accepted from the cache),
a refused one for `negative_ttl`. Concurrent requests with the same token share one review.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Final

from reconciler.clock import REAL_CLOCK, Clock
from reconciler.metrics_auth import TOKEN_REVIEWS
from reconciler.review_budget import ReviewBudget, Verdict

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
        self._owns_client = owns_client
        self.reviews: ReviewBudget[str, Answer] = ReviewBudget(
            over_budget=Refusal(429, "too many new tokens to check now: retry shortly"),
            unavailable=lambda e: Refusal(
                503, f"cannot check the token with the API server: {type(e).__name__}"
            ),
            max_entries=max_entries,
            rate=rate,
            burst=burst,
            max_in_flight=max_in_flight,
            review_timeout=review_timeout,
            clock=clock,
        )
        self.stats = self.reviews.stats

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
        self.reviews.cancel()
        if self._owns_client:
            await self.client.close()

    async def check(self, authorization: str) -> Answer:
        """The pod the request's `Authorization: Bearer` token is bound to, or a Refusal."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Refusal(401, "a bearer token is required")
        key = hashlib.sha256(token.encode()).hexdigest()
        return await self.reviews.answer(key, lambda: self._verdict(token))

    async def _verdict(self, token: str) -> Verdict[Answer]:
        review = await self.client.request(
            "POST",
            TOKEN_REVIEWS,
            json_body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token, "audiences": [self.audience]},
            },
        )
        answer = identity_of(review, self.audience)
        if not isinstance(answer, PodIdentity):
            return Verdict(answer, False, self.negative_ttl)
        ttl = self.max_ttl
        exp = token_exp(token)
        if exp is not None:
            # The clock is monotonic: the wall-clock exp becomes a lifetime from now.
            ttl = min(ttl, exp - time.time() - self.expiry_margin)
        return Verdict(answer, True, ttl)  # ttl <= 0: valid now, not cached
