"""Who saves a rank's stop: exactly one actor per rank, claimed once (jit.py, watcher.py)."""

from __future__ import annotations

import threading
from enum import Enum


class StopOwner(Enum):
    TRAINING = "training"  # the training thread, at a step boundary
    WATCHER = "watcher"  # the stop watcher's thread, away from one (watcher.py)


class Claim:
    """The first actor to claim the stop owns it; the claim never changes afterwards."""

    def __init__(self) -> None:
        self.owner: StopOwner | None = None
        self._lock = threading.Lock()

    def claim(self, who: StopOwner) -> bool:
        """Make `who` the owner unless another actor is already; whether `who` owns it."""
        with self._lock:
            if self.owner is None:
                self.owner = who
            return self.owner is who
