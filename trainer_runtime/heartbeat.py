"""The writer's side of the hand-over (handover.py): a checkpoint being written says so.

While a checkpoint is written, its sentinel holds who writes it (`owner_record`) and is touched
every HEARTBEAT_SECONDS by a daemon thread (`start`), which stops when the sentinel goes (the
checkpoint committed or discarded) or the process dies. A replacement pod's restore waits while
the sentinel still changes (handover.py, the reader's side); layout.py starts the beat when it
creates the sentinel. Kept apart from handover.py so that layout needs nothing of the reader.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
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


def owner_record() -> str:
    """What the sentinel says about its writer (for people reading the volume)."""
    return (
        json.dumps(
            {
                "writer": "kubeckpt",
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "since": time.time(),
                # How long a replacement may wait for this writer: its own grace, which may be
                # longer than the replacement's (the webhook sizes each pod's at its creation).
                "graceSeconds": wait_timeout(),
            }
        )
        + "\n"
    )


class Heartbeat(threading.Thread):
    """Touches `sentinel` every `interval` seconds until it is gone or `stop()` is called."""

    def __init__(self, sentinel: Path, interval: float = HEARTBEAT_SECONDS) -> None:
        super().__init__(name=f"kubeckpt-heartbeat:{sentinel.parent.name}", daemon=True)
        self.sentinel = sentinel
        self.interval = interval
        self._halt = threading.Event()  # not `_stop`: that is Thread's own method, join() calls it

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                os.utime(self.sentinel)
            except FileNotFoundError:
                return  # committed (the sentinel went) or discarded
            except OSError as e:  # a read-only or full volume: the reader's wait is bounded
                log.debug("kubeckpt: heartbeat on %s: %s", self.sentinel, e)

    def stop(self) -> None:
        self._halt.set()


def start(sentinel: Path) -> Heartbeat:
    hb = Heartbeat(sentinel)
    hb.start()
    return hb
