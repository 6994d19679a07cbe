"""Client retry rules against a tiny local HTTP server that fakes one behaviour each (429 then 200,
5xx, 401 after rotation). Waits are recorded by a clock instead of slept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from reconciler.auth import FileToken
from reconciler.client import Client, parse_retry_after
from reconciler.clock import FakeClock
from reconciler.config import ClientConfig, load_incluster
from reconciler.errors import ServerError, TooManyRequests, TransportError, Unauthorized


class RecordingClock(FakeClock):
    """Sleeps return at once, advancing fake time and recording the requested waits."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.step(max(seconds, 0))
        await asyncio.sleep(0)


Handler = Callable[[web.Request], web.Response]


@pytest.fixture
async def server() -> AsyncIterator[Callable[[Handler], str]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()

        async def h(request: web.Request) -> web.Response:
            return handler(request)

        app.router.add_route("*", "/{tail:.*}", h)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start  # type: ignore[misc]
    for r in runners:
        await r.cleanup()


def scripted(*responses: tuple[int, dict[str, str]]) -> tuple[Handler, list[web.Request]]:
    seen: list[web.Request] = []

    def handler(request: web.Request) -> web.Response:
        seen.append(request)
        status, headers = responses[min(len(seen), len(responses)) - 1]
        body = f'{{"kind":"Status","code":{status}}}' if status >= 400 else '{"ok":true}'
        return web.Response(status=status, headers=headers, text=body)

    return handler, seen


async def test_429_then_200_honours_retry_after(server) -> None:
    handler, seen = scripted((429, {"Retry-After": "3"}), (200, {}))
    clock = RecordingClock()
    async with Client(ClientConfig(await server(handler), qps=None), clock=clock) as c:
        assert await c.request("GET", "/api/v1/namespaces") == {"ok": True}
    assert len(seen) == 2
    assert clock.slept == [3.0]
    assert c.retries == 1


async def test_post_is_retried_only_when_the_server_says_when(server) -> None:
    handler, seen = scripted((503, {"Retry-After": "1"}), (201, {}))
    clock = RecordingClock()
    async with Client(ClientConfig(await server(handler), qps=None), clock=clock) as c:
        await c.request("POST", "/x", json_body={})
    assert len(seen) == 2 and clock.slept == [1.0]

    handler, seen = scripted((500, {}), (201, {}))
    async with Client(ClientConfig(await server(handler), qps=None), clock=clock) as c:
        with pytest.raises(ServerError):
            await c.request("POST", "/x", json_body={})
    assert len(seen) == 1, "a POST that may have been applied is not resent"


async def test_get_retries_5xx_with_backoff_and_gives_up(server) -> None:
    handler, seen = scripted((500, {}))
    clock = RecordingClock()
    cfg = ClientConfig(await server(handler), qps=None, max_retries=3)
    async with Client(cfg, clock=clock) as c:
        with pytest.raises(ServerError):
            await c.request("GET", "/x")
    assert len(seen) == 4
    assert len(clock.slept) == 3 and clock.slept[0] < clock.slept[2]


async def test_retry_after_is_capped_and_exhaustion_raises_typed(server) -> None:
    handler, _ = scripted((429, {"Retry-After": "3600"}))
    clock = RecordingClock()
    cfg = ClientConfig(await server(handler), qps=None, max_retries=2, max_retry_wait=5)
    async with Client(cfg, clock=clock) as c:
        with pytest.raises(TooManyRequests) as exc:
            await c.request("GET", "/x")
    assert clock.slept == [5, 5]
    assert exc.value.retry_after == 3600


async def test_qps_and_burst_space_requests(server) -> None:
    handler, seen = scripted((200, {}))
    clock = RecordingClock()
    cfg = ClientConfig(await server(handler), qps=5, burst=2)
    async with Client(cfg, clock=clock) as c:
        for _ in range(5):
            await c.request("GET", "/x")
    assert len(seen) == 5
    assert clock.slept == pytest.approx([0.2, 0.2, 0.2]), "2 at once, then one per 1/5 s"


async def test_token_file_is_reread_when_rotated_and_after_401(server, tmp_path: Path) -> None:
    valid = {"token-1"}

    def handler(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if auth.removeprefix("Bearer ") in valid:
            return web.json_response({"auth": auth})
        return web.Response(status=401, text='{"kind":"Status","code":401}')

    token_file = tmp_path / "token"
    token_file.write_text("token-1\n")
    cfg = ClientConfig(await server(handler), qps=None, token=FileToken(token_file))
    async with Client(cfg) as c:
        assert (await c.request("GET", "/"))["auth"] == "Bearer token-1"
        # The kubelet rotates the projected token by swapping a symlink: a new inode.
        new = tmp_path / "token.new"
        new.write_text("token-2")
        new.replace(token_file)
        valid.add("token-2")
        assert (await c.request("GET", "/"))["auth"] == "Bearer token-2"
        valid.clear()
        with pytest.raises(Unauthorized):
            await c.request("GET", "/")


async def test_connection_refused_is_a_transport_error() -> None:
    clock = RecordingClock()
    cfg = ClientConfig("http://127.0.0.1:9", qps=None, max_retries=1)
    async with Client(cfg, clock=clock) as c:
        with pytest.raises(TransportError):
            await c.request("GET", "/x")
    assert len(clock.slept) == 1


def test_parse_retry_after() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


def test_incluster_config(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc")
    (tmp_path / "namespace").write_text("team-a\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = load_incluster(tmp_path, env)
    assert cfg.server == "https://10.96.0.1:443"
    assert cfg.namespace == "team-a"
    assert cfg.token is not None and cfg.token.token() == "abc"
    assert cfg.ca_file == str(tmp_path / "ca.crt")
    v6 = load_incluster(tmp_path, {**env, "KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(RuntimeError):
        load_incluster(tmp_path, {})


async def test_adaptive_qps_halves_on_429_and_fixed_does_not(server) -> None:
    handler, seen = scripted((429, {"Retry-After": "1"}), (200, {}))
    url = await server(handler)
    clock = RecordingClock()
    async with Client(ClientConfig(url, qps=40.0, burst=40, adaptive_qps=True), clock=clock) as c:
        await c.request("GET", "/api/v1/namespaces")
        assert len(seen) == 2
        assert c.aimd is not None
        assert c.aimd.decreases == 1
        assert c._limiter is not None
        assert c._limiter.rate == 20.0  # set before the retry was sent
    handler2, _ = scripted((429, {"Retry-After": "1"}), (200, {}))
    async with Client(ClientConfig(await server(handler2), qps=40.0, burst=40)) as fixed:
        await fixed.request("GET", "/api/v1/namespaces")
        assert fixed.aimd is None
        assert fixed._limiter is not None and fixed._limiter.rate == 40.0
