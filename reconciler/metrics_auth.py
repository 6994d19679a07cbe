"""/metrics over HTTPS with authentication and authorization delegated to the API server.

What controller-runtime's `filters.WithAuthenticationAndAuthorization` does: the scraper presents a
bearer token (Prometheus: its ServiceAccount's); a TokenReview says whose it is, and a
SubjectAccessReview whether that user may `get` the non-resource URL `/metrics` (RBAC:
`nonResourceURLs: ["/metrics"], verbs: ["get"]`). No token: 401; not allowed: 403; the API server
unreachable: 503 (not cached).

Anyone who reaches the port can send a new token with every request, and each costs the API server
two reviews. So the reviews have a budget of their own, apart from everything else the process
sends (its Lease renewals above all; the engine is review_budget.py, which the progress push
endpoint's token check shares):

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

import hashlib
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from .clock import REAL_CLOCK, Clock
from .pem_files import pem_paths
from .review_budget import ReviewBudget, Verdict

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Key = tuple[str, str, str]
_Answer = tuple[int, str]


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
        self._owns_client = owns_client
        # The budget, the caches (allowed and refused apart) and the joining (review_budget.py).
        self.reviews: ReviewBudget[_Key, _Answer] = ReviewBudget(
            over_budget=(429, "too many new tokens to check now: retry shortly"),
            unavailable=lambda e: (
                503,
                f"cannot check the token with the API server: {type(e).__name__}",
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
        self.reviews.cancel()
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
        return await self.reviews.answer(key, lambda: self._verdict(token, request.path, verb))

    async def _verdict(self, token: str, path: str, verb: str) -> Verdict[_Answer]:
        status, reason = await self._review(token, path, verb)
        ok = status == 200
        return Verdict((status, reason), ok, self.ttl if ok else self.negative_ttl)

    async def _review(self, token: str, path: str, verb: str) -> _Answer:
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
