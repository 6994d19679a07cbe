"""Rank 0's progress push: in the background, newest record wins, a failure is dropped and never
reaches training, and the file is written as before."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainer_runtime.contract.progress import ProgressRecord
from trainer_runtime.progress_push import ProgressPusher
from trainer_runtime.progress_writer import ProgressWriter


class Received:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.auth: list[str] = []
        self.gate = threading.Event()
        self.gate.set()


@pytest.fixture
def server() -> Iterator[tuple[str, Received]]:
    got = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.gate.wait(10)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.bodies.append(json.loads(body))
            got.auth.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}/apis/x/status", got
    finally:
        srv.shutdown()


def wait_for(cond, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + within
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_writer_pushes_each_record_with_the_token(
    server: tuple[str, Received], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, got = server
    (tmp_path / "token").write_text("tok-1\n")
    monkeypatch.setenv("KUBECKPT_PROGRESS_PUSH_URL", url)
    monkeypatch.setenv("KUBECKPT_PROGRESS_PUSH_TOKEN", str(tmp_path / "token"))
    w = ProgressWriter(str(tmp_path / "progress.json"), enabled=True, every=1)
    assert w.pusher is not None
    w.write(ProgressRecord(step=3))
    wait_for(lambda: got.bodies)
    assert got.bodies[0]["step"] == 3 and got.auth[0] == "Bearer tok-1"
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 3


def test_no_env_no_pusher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECKPT_PROGRESS_PUSH_URL", raising=False)
    assert ProgressWriter(str(tmp_path / "p.json"), enabled=True, every=1).pusher is None


def test_offers_never_block_and_collapse_to_the_newest(server: tuple[str, Received]) -> None:
    url, got = server
    got.gate.clear()  # the server holds the first POST
    p = ProgressPusher(url, None, None)
    start = time.monotonic()
    for step in range(1, 51):
        p.offer(json.dumps({"step": step}).encode())
    assert time.monotonic() - start < 0.5  # the training loop never waits for the network
    got.gate.set()
    wait_for(lambda: got.bodies and got.bodies[-1]["step"] == 50)
    assert len(got.bodies) < 50  # the ones offered while a POST was in flight collapsed


def test_a_failed_push_is_dropped() -> None:
    p = ProgressPusher("https://127.0.0.1:1/apis/x/status", "/nonexistent/token", None)
    p.offer(b'{"step": 1}')
    wait_for(lambda: p.failed == 1)
    assert p.sent == 0
