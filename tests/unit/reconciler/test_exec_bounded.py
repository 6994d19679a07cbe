"""Every exec is bounded in time and always closed (kubernetes#67913: leaked exec streams drove an
API server to 11 GB). A local websocket server misbehaves the ways a hung pod, a stalled stream
or a dropped connection do; after many failing execs the client must hold no open connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from reconciler.client import Client
from reconciler.config import ClientConfig
from reconciler.exec import ERROR, STDOUT, ExecError, ExecTimeout, exec_command

MODES = ("hang", "partial", "drop", "no-status", "garbage-status", "ignore-close")


@pytest.fixture
async def server() -> AsyncIterator[tuple[Client, int]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        mode = request.query.getall("command")[0]
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",), autoclose=False)
        await ws.prepare(request)
        if mode == "hang":  # the pod never answers
            await asyncio.sleep(3600)
        elif mode == "partial":  # some output, then the stream stalls
            await ws.send_bytes(bytes([STDOUT]) + b"early")
            await asyncio.sleep(3600)
        elif mode == "drop":  # the API server drops the connection mid-stream
            await ws.send_bytes(bytes([STDOUT]) + b"x")
            assert request.transport is not None
            request.transport.abort()
        elif mode == "no-status":  # closes without an exit status
            await ws.close()
        elif mode == "garbage-status":  # an error channel that is not JSON
            await ws.send_bytes(bytes([ERROR]) + b"{not json")
            await ws.close()
        elif mode == "endless":  # `cat /dev/zero`: output that never ends
            with contextlib.suppress(ConnectionError, RuntimeError):
                while not ws.closed:
                    await ws.send_bytes(bytes([STDOUT]) + bytes(32 * 1024))
        elif mode == "ignore-close":  # the status, then the stream neither ends nor closes
            body = json.dumps({"metadata": {}, "status": "Success"}).encode()
            await ws.send_bytes(bytes([ERROR]) + body)
            await asyncio.sleep(3600)
        return ws

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/exec", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    client = Client(ClientConfig(f"http://127.0.0.1:{port}", qps=None))
    yield client, port
    await client.close()
    await runner.cleanup()


def _established_to(port: int) -> int:
    """This host's ESTABLISHED TCP connections whose remote end is 127.0.0.1:`port`."""
    count = 0
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        remote, state = fields[2], fields[3]
        if state == "01" and int(remote.split(":")[1], 16) == port:
            count += 1
    return count


async def test_failing_execs_end_in_time_and_leave_no_open_stream(
    server: tuple[Client, int],
) -> None:
    client, port = server
    outcomes: dict[str, set[str]] = {}
    for i in range(4 * len(MODES)):
        mode = MODES[i % len(MODES)]
        started = time.monotonic()
        try:
            r = await exec_command(client, "ns", "p", [mode], timeout=0.5)
            outcome = f"exit {r.exit_code}"
        except ExecTimeout as e:
            outcome = f"timeout {e.partial.stdout!r}"
        except ExecError as e:
            outcome = type(e).__name__
        # The deadline holds on every path, the close included (1 s at most on top).
        assert time.monotonic() - started < 0.5 + 1.0 + 0.5, (mode, outcome)
        outcomes.setdefault(mode, set()).add(outcome)
    assert outcomes["hang"] == {"timeout b''"}
    assert outcomes["partial"] == {"timeout b'early'"}
    assert outcomes["drop"] == {"ExecError"}
    assert outcomes["no-status"] == {"ExecError"}
    assert outcomes["garbage-status"] == {"ExecError"}
    assert outcomes["ignore-close"] == {"timeout b''"}  # the stream never ended
    await asyncio.sleep(0.2)
    assert _established_to(port) == 0, "an exec stream was left open"


async def test_stop_at_cap_closes_an_endless_stream_at_once(server: tuple[Client, int]) -> None:
    """A progress path that never ends (/dev/zero) costs the cap, not the timeout: the stream is
    closed as soon as the cap is passed, and nothing is left open."""
    client, port = server
    cap = 100_000
    started = time.monotonic()
    r = await exec_command(
        client, "ns", "p", ["endless"], max_bytes=cap, stop_at_cap=True, timeout=30
    )
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, elapsed  # far less than the 30 s timeout
    assert r.stdout_truncated and len(r.stdout) == cap and r.stdout == bytes(cap)
    assert r.exit_code is None
    # Without stop_at_cap the same stream runs into the timeout (the rest read and dropped).
    with pytest.raises(ExecTimeout) as e:
        await exec_command(client, "ns", "p", ["endless"], max_bytes=cap, timeout=1.0)
    assert e.value.partial.stdout_truncated and len(e.value.partial.stdout) == cap
    await asyncio.sleep(0.2)
    assert _established_to(port) == 0, "the exec stream was left open"
