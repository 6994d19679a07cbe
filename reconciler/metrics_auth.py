"""/metrics over HTTPS with authentication and authorization delegated to the API server.

What controller-runtime's `filters.WithAuthenticationAndAuthorization` does: the scraper presents a
bearer token (Prometheus: its ServiceAccount's); a TokenReview says whose it is, and a
SubjectAccessReview whether that user may `get` the non-resource URL `/metrics` (RBAC:
`nonResourceURLs: ["/metrics"], verbs: ["get"]`). No token: 401; not allowed: 403; the API server
unreachable: 503 (not cached). Answers are cached for `ttl` seconds by a hash of the token, so a
scrape every 15 s costs the API server two small requests a minute, not eight.

The server's own ServiceAccount needs `create` on tokenreviews and subjectaccessreviews (the
built-in `system:auth-delegator` ClusterRole grants exactly that).
"""

from __future__ import annotations

import hashlib
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from .errors import KubeError
from .pem_files import pem_paths

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MetricsAuth:
    """Checks each request's bearer token against the API server (TokenReview, then
    SubjectAccessReview for the request's path and verb)."""

    def __init__(self, client: Any, *, ttl: float = 60.0, max_entries: int = 1024) -> None:
        self.client = client
        self.ttl = ttl
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, str, str], tuple[float, int, str]] = OrderedDict()
        self.stats = {"reviews": 0, "cached": 0}

    async def check(self, request: web.Request) -> tuple[int, str]:
        """(HTTP status, reason): 200 when the request may proceed."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "a bearer token is required"
        verb = request.method.lower()
        key = (hashlib.sha256(token.encode()).hexdigest(), request.path, verb)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self.stats["cached"] += 1
            return hit[1], hit[2]
        try:
            status, reason = await self._review(token, request.path, verb)
        except (KubeError, OSError, TimeoutError) as e:  # not cached: the next scrape asks again
            return 503, f"cannot check the token with the API server: {type(e).__name__}"
        self._cache[key] = (now + self.ttl, status, reason)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return status, reason

    async def _review(self, token: str, path: str, verb: str) -> tuple[int, str]:
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
                headers = {"WWW-Authenticate": 'Bearer realm="metrics"'} if status == 401 else None
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
