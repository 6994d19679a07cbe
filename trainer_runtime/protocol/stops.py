"""What asks for a just-in-time stop, and the answer preStop waits for.

SIGTERM sets a flag (triggers.SignalTrigger); the preStop hook writes a request file
(triggers.RequestFile). Either one asks; one process per node (local rank 0) answers the request
file after the save, and answers it also when training ends without saving, so preStop never
waits out its timeout for nothing.
"""

from __future__ import annotations

import os
from typing import Any

from ..triggers import RequestFile, SignalTrigger


class StopControl:
    def __init__(self, control_dir: str | os.PathLike[str] | None, *, answers: bool) -> None:
        """`control_dir` None: no just-in-time stops (CHECKPOINT_JIT=false or checkpoints off).
        `answers`: this process writes the answer (local rank 0: the control dir is per pod)."""
        self.enabled = control_dir is not None
        self.signal = SignalTrigger() if self.enabled else None
        self.request = RequestFile(control_dir) if control_dir is not None else None
        self.answers = answers
        self.answered = False
        self.remote = False  # another rank was asked (the stop watcher spreads it)

    def install(self) -> None:
        if self.signal is not None and not self.signal.installed:
            self.signal.install()

    def requested(self) -> bool:
        if self.signal is not None and self.signal.fired:
            return True
        return self.request is not None and self.request.pending()

    def pending(self) -> bool:
        """A stop asked of this rank or, through the watcher, of another."""
        return self.remote or self.requested()

    def acknowledge(self, ok: bool, detail: dict[str, Any]) -> None:
        if self.request is not None and self.answers:
            self.request.acknowledge(ok, detail)
            self.answered = True

    def close(self, *, stopped: bool) -> None:
        """Give the signals back; answer a request that arrived as training ended."""
        if self.signal is not None:
            self.signal.uninstall(stopping=stopped)
        if self.request is not None and self.answers and not stopped and self.request.pending():
            self.request.acknowledge(False, {"error": "training ended without saving"})
