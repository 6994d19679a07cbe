"""The sender's push and a restore's fetch, over http.client (standard library).

`Pusher` is a daemon thread of the node's coordinator: the save protocol offers it each local
checkpoint once committed and goes on; it sends one copy at a time, and a newer offer supersedes
one not yet started (or one in progress, between two files). So the training step never waits
for a peer copy: at worst the copy lags or is skipped, and the persistent tier is the fallback.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from .. import layout
from ..contract import MANIFEST_FILE, Manifest, checksum_available, read_manifest
from ..fsutil import PEER_COPY_NICE, lower_thread_priority
from .gate import SaveGate
from .hashed_write import BodyEnded, write_hashed
from .server import CHECKSUM_HEADER, PREFIX

log = logging.getLogger("trainer_runtime.peer_copy")

TIMEOUT_SECONDS: Final = 60.0  # one socket operation, not the whole copy
BLOCK_BYTES: Final = 1024 * 1024
# A file is sent in pieces of this size, so that a push pauses soon while the node writes a
# checkpoint of its own (gate.py).
PIECE_BYTES: Final = 16 * 1024 * 1024
CLOSE_WAIT_SECONDS: Final = 2.0  # a push in progress gets this long to stop at close
# This many local checkpoints in a row superseded before their copy started: the node writes its
# own faster than a copy can be sent between them (gate.py), and it is said once per such run.
LAG_WARNING_SKIPS: Final = 3
FETCH_PREFIX: Final = ".peer-fetch-"


class PeerError(RuntimeError):
    """A push or a fetch that did not complete (the peer refused it, or it was unreachable)."""


class Removed(PeerError):
    """The checkpoint to send is gone from the ramdisk: retention removed it, a newer local
    checkpoint having replaced it between its offer and its push."""


@dataclass(frozen=True)
class Peer:
    """Where a node's peer copy server listens."""

    host: str
    port: int

    def connect(self) -> http.client.HTTPConnection:
        host = self.host.strip("[]")
        return http.client.HTTPConnection(
            host, self.port, timeout=TIMEOUT_SECONDS, blocksize=BLOCK_BYTES
        )


def _url(sender: int, step: int, rel: str | None) -> str:
    base = f"{PREFIX}{sender}/{step}"
    return f"{base}/manifest" if rel is None else f"{base}/files/{quote(rel)}"


def _expect(response: http.client.HTTPResponse, status: int, what: str) -> bytes:
    body = response.read()
    if response.status != status:
        reason = body[:500].decode("utf-8", "replace")
        raise PeerError(f"{what}: {response.status} {reason}")
    return body


def _put(
    conn: http.client.HTTPConnection,
    url: str,
    body: Any,
    headers: dict[str, str],
    what: str,
    pause: Callable[[], object] | None = None,
) -> None:
    """One PUT answered 201; a file body goes by sendfile (no copy through Python), in pieces
    with `pause` called before each. A receiver that refuses before reading the body (401,
    413) may close the connection while it is still sent: its answer is read all the same,
    where it came."""
    try:
        conn.putrequest("PUT", url, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        if isinstance(body, bytes):
            conn.send(body)
        else:
            assert conn.sock is not None
            size = int(headers["Content-Length"])
            for offset in range(0, size, PIECE_BYTES):
                if pause is not None:
                    pause()
                conn.sock.sendfile(body, offset, min(PIECE_BYTES, size - offset))
    except OSError as e:
        try:
            response = conn.getresponse()
        except (OSError, http.client.HTTPException):
            raise e from None
        _expect(response, 201, what)
        raise
    _expect(conn.getresponse(), 201, what)


def push_copy(
    peer: Peer,
    token: str,
    sender: int,
    step: int,
    directory: Path,
    *,
    superseded: threading.Event | None = None,
    pause: Callable[[], object] | None = None,
) -> int:
    """Send the complete checkpoint in `directory` as `sender`'s copy of `step`: every file, then
    the manifest. The bytes sent; PeerError when it did not complete (or was `superseded`
    between two files). `pause` is called between pieces of a file (Pusher._pause)."""
    auth = {"Authorization": f"Bearer {token}"}
    sent = 0
    conn = peer.connect()  # connects at the first request
    try:
        data = (directory / MANIFEST_FILE).read_bytes()
        manifest = Manifest.from_json(data)
        for f in manifest.files:
            if superseded is not None and superseded.is_set():
                raise PeerError(f"step {step}: superseded by a newer checkpoint, or closing")
            algorithm, _ = f.checksum
            with open(directory / f.path, "rb") as body:
                if os.fstat(body.fileno()).st_size != f.size:
                    raise PeerError(f"{f.path}: changed since its manifest was written")
                headers = {**auth, "Content-Length": str(f.size), CHECKSUM_HEADER: algorithm}
                _put(conn, _url(sender, step, f.path), body, headers, f.path, pause)
            sent += f.size
        headers = {**auth, "Content-Length": str(len(data))}
        _put(conn, _url(sender, step, None), data, headers, MANIFEST_FILE)
    except FileNotFoundError as e:  # the manifest or a file: retention removed the checkpoint
        raise Removed(f"step {step}: no longer in the ramdisk ({e.filename})") from None
    except (OSError, http.client.HTTPException) as e:
        raise PeerError(f"step {step} to {peer.host}:{peer.port}: {e}") from e
    finally:
        conn.close()
    return sent + len(data)


def fetch_copy(peer: Peer, token: str, sender: int, step: int, into: Path) -> Path:
    """Fetch `sender`'s copy of `step` from `peer` into the checkpoint directory `into`: into a
    hidden directory beside it first, verified by content against its manifest (sizes and
    checksums), and only then renamed `into`. PeerError when it cannot be fetched or verified,
    and nothing is left."""
    partial = into.with_name(FETCH_PREFIX + into.name)
    shutil.rmtree(partial, ignore_errors=True)
    auth = {"Authorization": f"Bearer {token}"}
    conn = peer.connect()
    try:
        partial.mkdir(parents=True)
        conn.request("GET", _url(sender, step, None), headers=auth)
        data = _expect(conn.getresponse(), 200, MANIFEST_FILE)
        manifest = Manifest.from_json(data)  # every path in it is checked relative and clean
        if manifest.step != step:
            raise PeerError(f"the copy's manifest is of step {manifest.step}, not {step}")
        for f in manifest.files:
            conn.request("GET", _url(sender, step, f.path), headers=auth)
            response = conn.getresponse()
            if response.status != 200:
                _expect(response, 200, f.path)
            if response.length != f.size:
                raise PeerError(f"{f.path}: {response.length} bytes offered, {f.size} listed")
            target = partial / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            # Hashed as it arrives: the copy is checked without reading it back.
            algorithm, expected = f.checksum
            if not checksum_available(algorithm):
                raise PeerError(f"{f.path}: its checksum ({algorithm}) cannot be computed here")
            if write_hashed(target, f.size, response, algorithm, BLOCK_BYTES) != expected:
                raise PeerError(f"the copy of step {step} does not verify: {f.path} ({algorithm})")
        (partial / MANIFEST_FILE).write_bytes(data)
        shutil.rmtree(into, ignore_errors=True)
        os.rename(partial, into)
        return into
    except (OSError, ValueError, BodyEnded, http.client.HTTPException) as e:  # ContractError too
        raise PeerError(f"step {step} from {peer.host}:{peer.port}: {e}") from e
    finally:
        conn.close()
        shutil.rmtree(partial, ignore_errors=True)


class Pusher:
    """Pushes this node's committed local checkpoints to its ring successor, newest only, on a
    daemon thread. `offer` never blocks."""

    def __init__(
        self, peer: Peer, token: str, sender: int, root: Path, gate: SaveGate | None = None
    ) -> None:
        self.peer = peer
        self.gate = gate
        self.token = token
        self.sender = sender
        self.root = root  # the ramdisk tier's root: checkpoint-<step>/ under it
        self.pushed: list[int] = []  # steps whose copy the successor accepted
        self.failures = 0
        self.last_error: str | None = None
        # Offers superseded before their copy started (or gone from the ramdisk by then).
        self.skipped = 0
        self.sending: int | None = None  # the step whose copy is on its way
        self._skipped_in_row = 0
        self._offered: int | None = None
        self._superseded = threading.Event()
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="kubeckpt-peer-push", daemon=True)
        self._thread.start()

    def offer(self, step: int) -> None:
        """A local checkpoint of `step` was committed: copy it to the peer (superseding older)."""
        with self._cond:
            if self._offered is not None:
                self._skip()
            self._offered = step
            self._superseded.set()  # a push in progress stops at its next file
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every offer is pushed or failed (tests, benches)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._offered is None and self.sending is None, timeout
            )

    def close(self, wait: float = CLOSE_WAIT_SECONDS) -> None:
        """Stop: a push in progress ends at its next piece (its gate closed first, by
        PeerCopy.close, where it waits there); wait up to `wait` s for that."""
        with self._cond:
            self._closed = True
            self._superseded.set()
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(wait)

    def _skip(self) -> None:
        """A checkpoint replaced by a newer one before its copy started (under `_cond`)."""
        self.skipped += 1
        self._skipped_in_row += 1
        if self._skipped_in_row == LAG_WARNING_SKIPS:
            log.warning(
                "kubeckpt: peer copies lag: %d local checkpoints in a row were replaced by newer "
                "ones before their copy could start (the node's own saves come first); until one "
                "is copied, a lost node resumes from an older copy or the persistent tier. A "
                "longer local period leaves time for the copies",
                self._skipped_in_row,
            )

    def _pause(self) -> None:
        """Between two pieces: the node's own save first (gate.py), and a close ends the push."""
        if self.gate is not None:
            self.gate.wait()
        if self._closed:
            raise PeerError("closing")

    def _loop(self) -> None:
        lower_thread_priority(PEER_COPY_NICE)  # a copy's sending yields the CPU to training
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._offered is not None or self._closed)
                if self._closed:
                    return
                step, self._offered = self._offered, None
                self._superseded.clear()
                self.sending = step
            assert step is not None
            try:
                directory = layout.checkpoint_path(self.root, step)
                push_copy(
                    self.peer,
                    self.token,
                    self.sender,
                    step,
                    directory,
                    superseded=self._superseded,
                    pause=self._pause,
                )
                self.pushed.append(step)
                self._skipped_in_row = 0
            except Removed as e:
                # Retention kept the newer checkpoint that replaced it, whose offer is on its
                # way: a skip like any other, not a failure.
                log.info("kubeckpt: peer copy skipped: %s", e)
                with self._cond:
                    self._skip()
            except Exception as e:  # the peer copy is best effort: the persistent tier remains
                if self._closed:  # the process is ending: nothing to report
                    log.info("kubeckpt: peer copy of step %d abandoned at close", step)
                    continue
                self.failures += 1
                self.last_error = str(e)
                log.warning("kubeckpt: peer copy of step %d not kept: %s", step, e)
            finally:
                with self._cond:
                    self.sending = None
                    self._cond.notify_all()


def read_own_size(root: Path) -> int:
    """The size of the node's newest complete local checkpoint (what its next one will need)."""
    best: tuple[int, int] = (-1, 0)
    for entry in layout.scan_dir(root):
        if entry.complete:
            try:
                manifest = read_manifest(layout.checkpoint_path(root, entry.step))
            except (OSError, ValueError):
                continue
            best = max(best, (manifest.sequence or 0, manifest.total_size))
    return best[1]
