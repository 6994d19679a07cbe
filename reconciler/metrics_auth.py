"""/metrics over HTTPS with authentication and authorization delegated to the API server.

What controller-runtime's `filters.WithAuthenticationAndAuthorization` does: the scraper presents a
bearer token (Prometheus: its ServiceAccount's); a TokenReview says whose it is, and a
SubjectAccessReview whether that user may `get` the non-resource URL `/metrics` (RBAC:
`nonResourceURLs: ["/metrics"], verbs: ["get"]`). No token: 401; not allowed: 403; the API server
unreachable: 503 (not cached).

Anyone who reaches the port can send a new token with every request, and each costs the API server
two reviews. So the reviews have a budget of their own, apart from everything else the process
sends (its Lease renewals above all):

- their own client (`MetricsAuth.with_own_client`: session, connection pool and no share of the
  process's client-side rate limit), a short timeout and no retries;
- at most `rate` new reviews per second (burst `burst`) and `max_in_flight` at once; beyond that
  429 with Retry-After at once, never a queue;
- answers cached by a hash of the token (never the token), path and verb: allowed for `ttl`
  seconds, refused (401, 403) for `negative_ttl`, each cache bounded (least recently used out),
  the two apart so that a flood of bad tokens cannot push out a good one;
- concurrent requests with the same token share one review.

A scrape every 15 s costs the API server two small requests a minute, not eight. The server's
own ServiceAccount needs `create` on tokenreviews and subjectaccessreviews (the built-in
`system:auth-delegator` ClusterRole grants exactly that).
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from aiohttp import web

from .clock import REAL_CLOCK, Clock
from .errors import KubeError
from .pem_files import pem_paths
from .ratelimit import TokenBucket

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Key = tuple[str, str, str]
_Answer = tuple[int, str]
K = TypeVar("K")
V = TypeVar("V")


class ExpiringCache(Generic[K, V]):
    """Answers by key until they expire; at most `size`, the least recently used out first.
    (The metrics endpoint's reviews and the progress push endpoint's share it.)"""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return hit[1]

    def put(self, key: K, answer: V, until: float) -> None:
        self._items[key] = (until, answer)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class MetricsAuth:
    """Checks each request's bearer token against the API server (TokenReview, then
    SubjectAccessReview for the request's path and verb), within a budget of its own."""

    def __init__(
        self,
        client: Any,
        *,
        ttl: float = 60.0,
        negative_ttl: float = 5.0,
        max_entries: int = 1024,
        rate: float = 5.0,
        burst: int = 20,
        max_in_flight: int = 4,
        review_timeout: float = 5.0,
        clock: Clock = REAL_CLOCK,
        owns_client: bool = False,
    ) -> None:
        """`client` sends the reviews: pass one of its own (`with_own_client`), or its
        requests wait in (and add to) that client's rate limit with everything else."""
        self.client = client
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.max_in_flight = max_in_flight
        self.review_timeout = review_timeout
        self._clock = clock
        self._owns_client = owns_client
        self._allowed: ExpiringCache[_Key, _Answer] = ExpiringCache(max_entries)
        self._refused: ExpiringCache[_Key, _Answer] = ExpiringCache(max_entries)
        self._budget = TokenBucket(rate, burst, clock)
        self._pending: dict[_Key, asyncio.Task[_Answer]] = {}
        self.stats = {"reviews": 0, "cached": 0, "joined": 0, "over_budget": 0}

    @classmethod
    def with_own_client(cls, client: Any, **kw: Any) -> MetricsAuth:
        """Reviews on a client derived from `client` (same server and credentials): its own
        session and pool of `max_in_flight` connections, no client-side rate limit (this
        budget is the limit) and no retries. Closed by `close()`."""
        in_flight = kw.get("max_in_flight", 4)
        own = client.derived(
            qps=None,
            max_connections=in_flight,
            max_retries=0,
            user_agent=f"{client.config.user_agent} metrics-auth",
        )
        return cls(own, owns_client=True, **kw)

    async def close(self) -> None:
        for task in list(self._pending.values()):
            task.cancel()
        if self._owns_client:
            await self.client.close()

    async def check(self, request: web.Request) -> _Answer:
        """(HTTP status, reason): 200 when the request may proceed."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "a bearer token is required"
        verb = request.method.lower()
        key = (hashlib.sha256(token.encode()).hexdigest(), request.path, verb)
        now = self._clock.now()
        for cache in (self._allowed, self._refused):
            if (hit := cache.get(key, now)) is not None:
                self.stats["cached"] += 1
                return hit
        task = self._pending.get(key)
        if task is not None:
            self.stats["joined"] += 1
        else:
            if len(self._pending) >= self.max_in_flight or not self._budget.try_take():
                self.stats["over_budget"] += 1
                return 429, "too many new tokens to check now: retry shortly"
            task = asyncio.create_task(self._resolve(key, token, request.path, verb))
            self._pending[key] = task
        # Shielded: a scraper that goes away does not cancel the review others wait on.
        return await asyncio.shield(task)

    async def _resolve(self, key: _Key, token: str, path: str, verb: str) -> _Answer:
        try:
            async with asyncio.timeout(self.review_timeout):
                status, reason = await self._review(token, path, verb)
        except (KubeError, OSError, TimeoutError) as e:  # not cached: the next scrape asks again
            return 503, f"cannot check the token with the API server: {type(e).__name__}"
        finally:
            self._pending.pop(key, None)
        now = self._clock.now()
        if status == 200:
            self._allowed.put(key, (status, reason), now + self.ttl)
        else:
            self._refused.put(key, (status, reason), now + self.negative_ttl)
        return status, reason

    async def _review(self, token: str, path: str, verb: str) -> _Answer:
        self.stats["reviews"] += 1
        review = await self.client.request(
            "POST",
            TOKEN_REVIEWS,
            json_body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        st = (review or {}).get("status") or {}
        if not st.get("authenticated"):
            return 401, "the token is not valid"
        user = st.get("user") or {}
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = await self.client.request(
            "POST",
            ACCESS_REVIEWS,
            json_body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        if ((access or {}).get("status") or {}).get("allowed"):
            return 200, "ok"
        return 403, f"{spec['user']} may not {verb} {path}"

    def protect(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            status, reason = await self.check(request)
            if status != 200:
                headers = {}
                if status == 401:
                    headers["WWW-Authenticate"] = 'Bearer realm="metrics"'
                elif status in (429, 503):
                    headers["Retry-After"] = "1"
                return web.Response(status=status, text=reason + "\n", headers=headers)
            return await handler(request)

        return guarded


def server_tls(cert_dir: str | None, hosts: Sequence[str] = ("localhost",)) -> ssl.SSLContext:
    """A TLS 1.2+ server context from `cert_dir`/tls.crt and tls.key (cert-manager's Secret
    layout), or with a self-signed certificate made now, as controller-runtime does when none
    is given (the scraper then verifies nothing but the token flow stays private)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir:
        ctx.load_cert_chain(Path(cert_dir, "tls.crt"), Path(cert_dir, "tls.key"))
        return ctx
    from .pki import self_signed  # cryptography is imported only when a certificate is made

    cert, key = self_signed(hosts)
    # Not a temporary directory: the container's root filesystem is read-only, with no /tmp.
    with pem_paths(cert, key) as (cert_path, key_path):
        ctx.load_cert_chain(cert_path, key_path)
    return ctx
