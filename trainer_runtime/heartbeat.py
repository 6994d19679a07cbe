"""The writer's side of the hand-over (handover.py): a checkpoint being written says so.

While a checkpoint is written, its sentinel holds who writes it (`owner`) and a daemon thread
(`Heartbeat`) changes it every HEARTBEAT_SECONDS until the checkpoint is committed or discarded,
or the process dies. A replacement pod's restore waits while the sentinel still changes
(handover.py, the reader's side). On a filesystem the beat touches the file (`start`: its
modification time changes; the thread ends by itself once the sentinel is gone); in an object
store, which has no modification time to touch, it re-uploads the sentinel with a body that
differs each time (`start_upload`: a counter `beat`, so its ETag changes), and the writer stops
it before it commits or discards (storage.S3Tier), since a PUT would recreate a deleted
sentinel. layout.py and storage.py start the beat when they create the sentinel. Kept apart from
handover.py so that the writers need nothing of the reader.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .contract import TORCH_ELASTIC_SHUTDOWN_TIMEOUT

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
DEFAULT_WAIT_SECONDS = 300.0


def wait_timeout(environ: dict[str, str] | None = None) -> float:
    """How long a replacement may wait: the victim's grace (minus the webhook's margin), which
    the webhook injects as TORCH_ELASTIC_SHUTDOWN_TIMEOUT into every pod of the job alike."""
    raw = (os.environ if environ is None else environ).get(TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_WAIT_SECONDS
    return value if value > 0 else DEFAULT_WAIT_SECONDS


def owner(since: float | None = None) -> dict[str, object]:
    """Who writes the checkpoint (for people reading the volume) and its grace (for the reader)."""
    return {
        "writer": "kubeckpt",
        "host": socket.gethostname(),  # the pod's name in Kubernetes
        "pid": os.getpid(),
        "since": time.time() if since is None else since,
        # How long a replacement may wait for this writer: its own grace, which may be
        # longer than the replacement's (the webhook sizes each pod's at its creation).
        "graceSeconds": wait_timeout(),
    }


def owner_record() -> str:
    """A sentinel file's body: `owner()` as JSON."""
    return json.dumps(owner()) + "\n"


class Heartbeat(threading.Thread):
    """Calls `touch(n)` (n = 1, 2, ...) every `interval` seconds until `touch` raises
    FileNotFoundError (the sentinel, or its bucket, is gone) or `stop()` is called. Other errors
    are logged and the beat goes on: the reader's wait is bounded anyway."""

    def __init__(
        self, name: str, touch: Callable[[int], object], interval: float = HEARTBEAT_SECONDS
    ) -> None:
        super().__init__(name=f"kubeckpt-heartbeat:{name}", daemon=True)
        self.touch = touch
        self.interval = interval
        self._halt = threading.Event()  # not `_stop`: that is Thread's own method, join() calls it

    def run(self) -> None:
        n = 0
        while not self._halt.wait(self.interval):
            n += 1
            try:
                self.touch(n)
            except FileNotFoundError:
                return  # committed (the sentinel went) or discarded
            except Exception as e:  # a read-only or full volume, an unreachable store
                log.debug("kubeckpt: heartbeat %s: %s", self.name, e)

    def stop(self) -> None:
        self._halt.set()


def start(sentinel: Path) -> Heartbeat:
    """Touch the sentinel file `sentinel` (its modification time) until it is gone."""
    hb = Heartbeat(sentinel.parent.name, lambda _: os.utime(sentinel))
    hb.start()
    return hb


def start_upload(name: str, put: Callable[[bytes], object]) -> Heartbeat:
    """Upload a sentinel object with `put(body)` now (its errors raise), then re-upload it every
    HEARTBEAT_SECONDS with the same owner record and a counter `beat` (0, 1, 2, ...: the body,
    and so the ETag, changes each time) until stopped. The writer must stop it (and join it)
    before the sentinel is deleted, or a PUT in flight would bring it back."""
    record = owner()

    def body(n: int) -> bytes:
        return (json.dumps({**record, "beat": n}) + "\n").encode()

    put(body(0))
    hb = Heartbeat(name, lambda n: put(body(n)))
    hb.start()
    return hb
