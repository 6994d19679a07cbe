"""A node's own saves come before the copies it sends and keeps.

A peer copy is sent after the local commit of step S, so it runs while training goes on and,
with a short local period, while the node writes its next checkpoint. Both move every byte of a
rank's state through the same cores and memory bus; a copy that competes with the node's own
write makes that write slower, and the next save (which waits for the previous one) then holds
the training step. So the sender and the receiver pause between pieces while the node writes a
checkpoint of its own, and go on as soon as it is written. The wait is bounded: a save that
hangs on a dead rank does not stall a copy past its socket timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Final

# Longer than any local save of a healthy node, shorter than a socket operation's timeout
# (client.TIMEOUT_SECONDS, server._Handler.timeout), so a paused copy is never cut for it.
MAX_PAUSE_SECONDS: Final = 30.0


class SaveGate:
    """Open while the node writes no checkpoint of its own. `hold` and `release` pair up (a JIT
    save may start while a periodic one is still being written)."""

    def __init__(self, max_pause: float = MAX_PAUSE_SECONDS) -> None:
        self.max_pause = max_pause
        self.paused_seconds = 0.0  # how long copies waited here, all together
        self._writing = 0
        self._closed = False
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()

    @property
    def shut(self) -> bool:
        """The node is writing a checkpoint of its own: copies wait."""
        return not self._open.is_set()

    def hold(self) -> None:
        """A save of the node's own begins: copies pause at their next piece."""
        with self._lock:
            self._writing += 1
            if not self._closed:
                self._open.clear()

    def release(self) -> None:
        """That save is written (or failed): copies go on."""
        with self._lock:
            self._writing = max(0, self._writing - 1)
            if self._writing == 0:
                self._open.set()

    def close(self) -> None:
        """The copies are closing: nothing pauses from now on."""
        with self._lock:
            self._closed = True
            self._open.set()

    def wait(self) -> bool:
        """Between two pieces of a copy: wait while the node writes its own; False when the
        bound ran out first (the copy then goes on all the same)."""
        if self._open.is_set():
            return True
        started = time.monotonic()
        opened = self._open.wait(self.max_pause)
        self.paused_seconds += time.monotonic() - started
        return opened
