"""The HTTP server in front of a PeerStore: the standard library's ThreadingHTTPServer on a
daemon thread of the node's coordinator, on the pod IP and a port the kernel picks (every rank
learns it at setup, service.py). A few requests, each large, so nothing faster is needed.

    PUT /peer/v1/<sender>/<step>/files/<path>   one file; Content-Length required;
                                                X-Kubeckpt-Checksum: the algorithm to hash with
    PUT /peer/v1/<sender>/<step>/manifest       the manifest, last: the copy is complete
    GET the same paths                          a complete copy's files, for a restore

Every request carries `Authorization: Bearer <token>`, the job's token (global rank 0 draws it at
setup and every rank receives it over the job's own collectives): without it nothing is served or
stored. The store refuses the rest (store.Refused: its status and reason, in plain text).
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO, Final
from urllib.parse import unquote

from ..fsutil import PEER_COPY_NICE, lower_thread_priority
from .store import PeerStore, Refused

log = logging.getLogger("trainer_runtime.peer_copy")

PREFIX: Final = "/peer/v1/"
CHECKSUM_HEADER: Final = "X-Kubeckpt-Checksum"
MAX_MANIFEST_BODY: Final = 16 * 1024 * 1024  # contract.manifest.MAX_MANIFEST_BYTES
DRAIN_BYTES: Final = 4 * 1024 * 1024  # a refused body up to this size is read before answering
# Connections served at once: the job's own traffic is one push and one fetch per node; anything
# on the pod network may connect, so the threads (each may wait `_Handler.timeout` for headers)
# are bounded and a connection past the bound is closed at once.
MAX_CONNECTIONS: Final = 8
# Bounded: closing runs on the way out of a stopping pod, within its grace period.
STOP_WAIT_SECONDS: Final = 2.0


def parse_path(path: str) -> tuple[int, int, str | None]:
    """(sender, step, file path or None for the manifest) of a request path; Refused if malformed.
    The file path is unquoted here and checked by the store."""
    if not path.startswith(PREFIX):
        raise Refused(404, "not a peer copy path")
    parts = path[len(PREFIX) :].split("/", 3)
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
        raise Refused(404, f"malformed path {path[:200]!r}")
    sender, step = int(parts[0]), int(parts[1])
    if parts[2] == "manifest" and len(parts) == 3:
        return sender, step, None
    if parts[2] == "files" and len(parts) == 4:
        return sender, step, unquote(parts[3])
    raise Refused(404, f"malformed path {path[:200]!r}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # one connection per push (keep-alive)
    timeout = 120  # seconds a socket read may wait: a stalled client does not hold a thread
    server: PeerServer

    def log_message(self, format: str, *args: object) -> None:
        log.debug("kubeckpt: peer copy server: " + format, *args)

    def _authorized_store(self) -> PeerStore:
        """The store, for a request carrying the job's token; else Refused(401), counted."""
        store, token = self.server.store, self.server.token
        if store is None:  # setup has not finished: nothing is served yet
            raise Refused(401, "bad or missing token")
        given = self.headers.get("Authorization", "")
        if token is None or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            store.refused += 1
            raise Refused(401, "bad or missing token")
        return store

    def _answer(self, status: int, text: str = "") -> None:
        body = text.encode("utf-8", "replace")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            self.send_header("Connection", "close")  # the unread body must not be parsed
            self.close_connection = True
        try:
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the sender left (a push cut at close)
            self.close_connection = True

    def _drain(self, body: _Counted, length: int) -> None:
        """Read what is left of a small refused body, so that closing the connection does not
        reset it before the sender reads why (a large one is left: the reset is the answer)."""
        left = length - body.count
        if 0 < left <= DRAIN_BYTES:
            try:
                body.read(left)
            except OSError:
                pass

    def _length(self) -> int:
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.isdigit():
            raise Refused(411, "Content-Length required")
        return int(raw)

    def do_PUT(self) -> None:
        body = _Counted(self.rfile)
        length = 0
        try:
            store = self._authorized_store()
            sender, step, rel = parse_path(self.path)
            length = self._length()
            if rel is None:
                if length > MAX_MANIFEST_BODY:
                    raise Refused(413, "manifest too large")
                store.commit(sender, step, body.read(length))
            else:
                checksum = self.headers.get(CHECKSUM_HEADER)
                store.put_file(sender, step, rel, length, body, checksum)  # type: ignore[arg-type]
        except Refused as e:
            self._drain(body, length)
            self._answer(e.status, e.reason)
        except Exception as e:  # a bug or the disk: the sender gives up on this copy
            log.warning("kubeckpt: peer copy server: %s", e)
            self._answer(500, f"{type(e).__name__}: {e}")
        else:
            self._answer(HTTPStatus.CREATED)

    def do_GET(self) -> None:
        try:
            store = self._authorized_store()
            sender, step, rel = parse_path(self.path)
            fd, size = store.open(sender, step, rel)
        except Refused as e:
            self._answer(e.status, e.reason)
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with os.fdopen(fd, "rb", closefd=False) as f:
                self.wfile.flush()
                self.connection.sendfile(f, count=size)
        finally:
            os.close(fd)


class _Counted:
    """A request body that counts what was read of it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.count = 0

    def read(self, n: int) -> bytes:
        data = self.raw.read(n)
        self.count += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        self.count += n
        return n


class PeerServer(ThreadingHTTPServer):
    """Serves `store` to requests carrying `token`, on (`host`, `port`: 0, a free one). The token
    may be set after the start (setup learns the port first): until then nothing is served."""

    daemon_threads = True

    def __init__(
        self, store: PeerStore | None, token: str | None, host: str, port: int = 0
    ) -> None:
        self.store = store
        self.token = token
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused_connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused_connections += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # a thread of its own
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # Receiving and hashing a peer's copy yields the CPU to this pod's training, more than
        # its own writer thread does (fsutil.PEER_COPY_NICE).
        lower_thread_priority(PEER_COPY_NICE)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> PeerServer:
        self._thread = threading.Thread(
            target=self.serve_forever, name="kubeckpt-peer-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, wait: float = STOP_WAIT_SECONDS) -> None:
        """Stop accepting, then wait up to `wait` s for the requests being served (a receive
        whose sender has gone ends at once, and removes its partial copy)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self.shutdown()
            thread.join(5)
            self.server_close()
        deadline = time.monotonic() + wait
        taken = 0
        while taken < MAX_CONNECTIONS and self._slots.acquire(
            timeout=max(0.0, deadline - time.monotonic())
        ):
            taken += 1
        for _ in range(taken):
            self._slots.release()
