"""The HTTP transport: aiohttp with a connection pool, timeouts, client-side QPS/burst limits,
retries that honour Retry-After, bearer tokens re-read on rotation, typed errors, and discovery.

Retry rule: a 429 or 5xx carrying Retry-After is retried for any verb (the server says it did not
act and when to come back); a 5xx without it, or a connection failure, only for GET, with
exponential backoff. At most `max_retries` retries, each wait capped at `max_retry_wait`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import json
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from .clock import REAL_CLOCK, Clock
from .config import ClientConfig, load_config
from .errors import ApiError, ResourceNotFound, TransportError, api_error
from .ratelimit import AimdRate, TokenBucket
from .resources import Params, Resource, ResourceClient

log = logging.getLogger(__name__)

_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class Client:
    """An API client. Create it anywhere; the aiohttp session is opened inside the running loop on
    first use. Close it with `await client.close()` or `async with Client(...)`."""

    def __init__(self, config: ClientConfig, *, clock: Clock = REAL_CLOCK) -> None:
        self.config = config
        self._clock = clock
        self._ssl = config.ssl_context()
        self._session: aiohttp.ClientSession | None = None
        self._limiter = TokenBucket(config.qps, config.burst, clock) if config.qps else None
        self.aimd = (
            AimdRate(config.qps, floor=min(1.0, config.qps), clock=clock)
            if config.qps and config.adaptive_qps
            else None
        )
        self._discovery: dict[str, dict[str, Resource]] = {}
        self._discovery_lock = asyncio.Lock()
        # (method, code) -> count; code "error" for transport failures. Read by the metrics.
        self.request_counts: Counter[tuple[str, str]] = Counter()
        self.retries = 0

    def derived(self, **overrides: Any) -> Client:
        """A client for the same server and credentials with `overrides` of its configuration
        (ClientConfig's fields: qps, burst, max_connections, user_agent, ...) and a session,
        connection pool and rate limit of its own, so that its requests never wait behind this
        client's, nor this client's behind its own (client-go: a second rest.Config, as
        controller-runtime's leader election uses). Its requests are counted in this client's
        `request_counts` (one set of metrics). Close it as any client."""
        other = Client(dataclasses.replace(self.config, **overrides), clock=self._clock)
        other.request_counts = self.request_counts
        return other

    @classmethod
    def from_kubeconfig(cls, path: Any = None, context: str | None = None, **kw: Any) -> Client:
        from .config import load_kubeconfig

        return cls(load_kubeconfig(path, context), **kw)

    @classmethod
    def auto(cls, **kw: Any) -> Client:
        """In-cluster configuration in a pod, else $KUBECONFIG / ~/.kube/config."""
        return cls(load_config(), **kw)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.config.max_connections, ssl=self._ssl)
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={"User-Agent": self.config.user_agent},
            )
        return self._session

    def url(self, path: str) -> str:
        return self.config.server.rstrip("/") + path

    def _headers(
        self, content_type: str | None = None, accept: str | None = "application/json"
    ) -> dict[str, str]:
        # No Accept on a websocket upgrade (client-go sends none): for the protocols the API
        # server proxies to the node as websockets (v4 and older), the node's exec handler
        # (KWOK's, seen in tests/integration/reconciler/test_exec_kwok.py) answered 406 to
        # `Accept: application/json`.
        headers: dict[str, str] = {"Accept": accept} if accept else {}
        if self.config.token is not None:
            token = self.config.token.token()
            if token:
                headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _request_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.config.tls_server_name:
            kw["server_hostname"] = self.config.tls_server_name
        return kw

    async def _throttle(self) -> None:
        if self._limiter is not None:
            if self.aimd is not None:
                self._limiter.set_rate(self.aimd.rate())
            await self._limiter.wait()

    def _throttled(self, retry_after: float | None) -> None:
        """The server answered 429: with an adaptive QPS, send slower from now on."""
        if self.aimd is not None:
            rate = self.aimd.throttled(retry_after)
            log.debug("429 from the API server: client rate now %.1f/s", rate)

    def _backoff(self, attempt: int) -> float:
        return min(0.2 * 2 ** (attempt - 1), 10.0) * (0.5 + random.random() / 2)

    async def request_raw(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        data: bytes | None = None,
        content_type: str | None = None,
        request_timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """Send with throttling and retries; return (status, body) of a 2xx/3xx, else raise."""
        attempt = 0
        reauthenticated = False
        client_timeout = aiohttp.ClientTimeout(
            total=request_timeout or self.config.timeout, connect=self.config.connect_timeout
        )
        while True:
            await self._throttle()
            try:
                async with self.session.request(
                    method,
                    self.url(path),
                    params=params,
                    data=data,
                    headers=self._headers(content_type),
                    timeout=client_timeout,
                    **self._request_kwargs(),
                ) as resp:
                    body = await resp.read()
                    status = resp.status
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError) as e:
                self.request_counts[(method, "error")] += 1
                if method in _IDEMPOTENT and attempt < self.config.max_retries:
                    attempt += 1
                    self.retries += 1
                    await self._clock.sleep(self._backoff(attempt))
                    continue
                raise TransportError(f"{method} {path}: {e!r}") from e
            self.request_counts[(method, str(status))] += 1
            if status < 400:
                return status, body
            if status == 429:
                self._throttled(retry_after)
            if status == 401 and self.config.token is not None and not reauthenticated:
                # The token may have rotated since we read it.
                self.config.token.invalidate()
                reauthenticated = True
                continue
            retryable = status == 429 or status >= 500
            if (
                retryable
                and attempt < self.config.max_retries
                and (retry_after is not None or method in _IDEMPOTENT)
            ):
                attempt += 1
                self.retries += 1
                wait = retry_after if retry_after is not None else self._backoff(attempt)
                log.debug("%s %s: %s, retry %d in %.2fs", method, path, status, attempt, wait)
                await self._clock.sleep(min(wait, self.config.max_retry_wait))
                continue
            raise api_error(status, body, retry_after)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        content_type: str | None = None,
        request_timeout: float | None = None,
    ) -> Any:
        """Like `request_raw`, with a JSON body in and the parsed JSON response out."""
        if json_body is not None:
            data = json.dumps(json_body, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        _, body = await self.request_raw(
            method,
            path,
            params=params,
            data=data,
            content_type=content_type,
            request_timeout=request_timeout,
        )
        return json.loads(body) if body else None

    async def stream_lines(
        self, path: str, *, params: Params | None = None, read_timeout: float = 300.0
    ) -> AsyncIterator[bytes]:
        """GET a streaming response (a watch) and yield its newline-delimited records. No retries:
        the caller (the informer) decides how to resume. Lines of any length are accepted."""
        await self._throttle()
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.config.connect_timeout, sock_read=read_timeout
        )
        try:
            async with self.session.get(
                self.url(path),
                params=params,
                headers=self._headers(),
                timeout=timeout,
                **self._request_kwargs(),
            ) as resp:
                self.request_counts[("WATCH", str(resp.status))] += 1
                if resp.status >= 400:
                    if resp.status == 429:
                        self._throttled(parse_retry_after(resp.headers.get("Retry-After")))
                    if resp.status == 401 and self.config.token is not None:
                        self.config.token.invalidate()
                    body = await resp.read()
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                    raise api_error(resp.status, body, retry_after)
                # Our own line splitting: aiohttp's readline() refuses lines over 128 KiB, and an
                # object can be over 1 MiB.
                buf = bytearray()
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    if b"\n" not in chunk:
                        continue
                    *lines, rest = buf.split(b"\n")
                    buf = bytearray(rest)
                    for line in lines:
                        if line.strip():
                            yield bytes(line)
                if buf.strip():
                    yield bytes(buf)
        except (aiohttp.ClientError, TimeoutError) as e:
            self.request_counts[("WATCH", "error")] += 1
            raise TransportError(f"watch {path}: {e!r}") from e

    async def ws_connect(
        self, path: str, *, params: Params, protocols: tuple[str, ...], close_timeout: float = 10.0
    ) -> aiohttp.ClientWebSocketResponse:
        """Open a websocket (pods/exec, attach, portforward) with our auth and TLS."""
        await self._throttle()
        try:
            ws = await self.session.ws_connect(
                self.url(path),
                params=params,
                protocols=protocols,
                headers=self._headers(accept=None),
                max_msg_size=0,  # frames are small; the exec client caps what it keeps
                timeout=aiohttp.ClientWSTimeout(ws_close=close_timeout),
                **self._request_kwargs(),
            )
        except aiohttp.WSServerHandshakeError as e:
            self.request_counts[("WS", str(e.status))] += 1
            if e.status == 429:
                self._throttled(None)
            raise api_error(e.status, e.message) from e
        except (aiohttp.ClientError, TimeoutError) as e:
            self.request_counts[("WS", "error")] += 1
            raise TransportError(f"websocket {path}: {e!r}") from e
        self.request_counts[("WS", "101")] += 1
        return ws

    # --- discovery ---
    async def _group_version(self, api_version: str, refresh: bool) -> dict[str, Resource]:
        async with self._discovery_lock:
            cached = self._discovery.get(api_version)
            if cached is not None and not refresh:
                return cached
            group, _, version = api_version.rpartition("/")
            path = f"/apis/{api_version}" if group else f"/api/{version}"
            try:
                doc = await self.request("GET", path)
            except ApiError as e:
                if e.status == 404:
                    raise ResourceNotFound(f"the server has no API {api_version}") from e
                raise
            found: dict[str, Resource] = {}
            subs: dict[str, set[str]] = {}
            for r in doc.get("resources", []):
                plural, _, sub = r["name"].partition("/")
                if sub:
                    subs.setdefault(plural, set()).add(sub)
            for r in doc.get("resources", []):
                if "/" in r["name"]:
                    continue
                res = Resource(
                    group,
                    version,
                    r["name"],
                    r["kind"],
                    bool(r.get("namespaced")),
                    frozenset(subs.get(r["name"], ())),
                )
                names = [
                    r["name"],
                    r["kind"],
                    r.get("singularName") or "",
                    *r.get("shortNames", []),
                ]
                for n in names:
                    if n:
                        found.setdefault(n.lower(), res)
            self._discovery[api_version] = found
            return found

    async def resource(self, api_version: str, kind_or_plural: str) -> Resource:
        """Discover a resource by apiVersion ("v1", "apps/v1") and kind, plural, singular or short
        name. A miss refreshes the group's document once (a CRD may have just been installed)."""
        key = kind_or_plural.lower()
        found = await self._group_version(api_version, refresh=False)
        if key not in found:
            found = await self._group_version(api_version, refresh=True)
        if key not in found:
            raise ResourceNotFound(f"{api_version} has no resource {kind_or_plural!r}")
        return found[key]

    def api(self, resource: Resource) -> ResourceClient:
        return ResourceClient(self, resource)

    async def api_for(self, api_version: str, kind_or_plural: str) -> ResourceClient:
        return ResourceClient(self, await self.resource(api_version, kind_or_plural))

    async def server_version(self) -> dict[str, Any]:
        return await self.request("GET", "/version")


@contextlib.asynccontextmanager
async def connect(config: ClientConfig | None = None) -> AsyncIterator[Client]:
    """`async with connect() as client:` with the automatic configuration by default."""
    client = Client(config or load_config())
    try:
        yield client
    finally:
        await client.close()
