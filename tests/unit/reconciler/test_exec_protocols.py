"""The exec client's framing against a local websocket server that speaks the channel protocol
(one behaviour each: a v4-only server, a v5 server that records what it receives). The same
client runs against KWOK through the real API server in tests/integration/reconciler."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from reconciler.client import Client
from reconciler.config import ClientConfig
from reconciler.exec import CLOSE, ERROR, STDERR, STDIN, STDOUT, ExecError, exec_command

Server = Callable[..., Awaitable[tuple[Client, dict]]]


@pytest.fixture
async def ws_server() -> AsyncIterator[Server]:
    runners: list[web.AppRunner] = []
    clients: list[Client] = []

    async def start(protocols: tuple[str, ...], status: dict | None = None) -> tuple[Client, dict]:
        seen: dict = {"frames": []}

        async def exec_handler(request: web.Request) -> web.WebSocketResponse:
            seen["query"] = list(request.query.items())
            seen["offered"] = request.headers.get("Sec-WebSocket-Protocol", "")
            ws = web.WebSocketResponse(protocols=protocols)
            await ws.prepare(request)
            seen["protocol"] = ws.ws_protocol
            if request.query.get("stdin") == "true":
                async for msg in ws:
                    seen["frames"].append(msg.data)
                    if ws.ws_protocol.startswith("v5") and msg.data == bytes([CLOSE, STDIN]):
                        break
                    if ws.ws_protocol.startswith("v4"):
                        break
            await ws.send_bytes(bytes([STDOUT]))  # an empty first frame, as the server sends
            await ws.send_bytes(bytes([STDOUT]) + b"\x00\x01out")
            await ws.send_bytes(bytes([STDERR]) + b"err")
            body = json.dumps(status or {"metadata": {}, "status": "Success"}).encode()
            await ws.send_bytes(bytes([ERROR]) + body[:10])  # a status may span frames
            await ws.send_bytes(bytes([ERROR]) + body[10:])
            await ws.close()
            return ws

        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/exec", exec_handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        client = Client(ClientConfig(f"http://127.0.0.1:{runner.addresses[0][1]}", qps=None))
        clients.append(client)
        return client, seen

    yield start  # type: ignore[misc]
    for c in clients:
        await c.close()
    for r in runners:
        await r.cleanup()


async def test_offers_v5_then_v4_and_speaks_v4(ws_server: Server) -> None:
    client, seen = await ws_server(("v4.channel.k8s.io",))
    r = await exec_command(client, "ns", "p", ["cat", "a b"], container="c")
    assert seen["offered"] == "v5.channel.k8s.io,v4.channel.k8s.io"
    assert r.protocol == "v4.channel.k8s.io"
    assert (r.stdout, r.stderr, r.exit_code) == (b"\x00\x01out", b"err", 0)
    assert seen["query"] == [
        ("command", "cat"),
        ("command", "a b"),
        ("stdout", "true"),
        ("stderr", "true"),
        ("container", "c"),
    ]


async def test_v5_sends_stdin_then_the_close_signal(ws_server: Server) -> None:
    client, seen = await ws_server(("v5.channel.k8s.io", "v4.channel.k8s.io"))
    r = await exec_command(client, "ns", "p", ["cat"], stdin=b"hello")
    assert r.protocol == "v5.channel.k8s.io"
    assert seen["frames"] == [bytes([STDIN]) + b"hello", bytes([CLOSE, STDIN])]
    assert ("stdin", "true") in seen["query"]


async def test_nonzero_exit_code_from_a_kubelet_status(ws_server: Server) -> None:
    status = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "message": "command terminated with non-zero exit code",
        "details": {"causes": [{"reason": "ExitCode", "message": "12"}]},
    }
    client, _ = await ws_server(("v5.channel.k8s.io",), status)
    assert (await exec_command(client, "ns", "p", ["false"])).exit_code == 12


async def test_a_failure_without_exit_code_raises(ws_server: Server) -> None:
    status = {"status": "Failure", "reason": "InternalError", "message": "container not found"}
    client, _ = await ws_server(("v5.channel.k8s.io",), status)
    with pytest.raises(ExecError) as e:
        await exec_command(client, "ns", "p", ["x"])
    assert e.value.status["message"] == "container not found"
