"""What asks for a just-in-time stop, SIGTERM or the preStop hook's request file, and the answer
preStop waits for.

The signal handler only sets a flag (a handler that saved from inside the signal would run at an
arbitrary bytecode in the middle of a step); the training loop polls the flag and the request file
once per step. The request file exists because a kubelet signals only the container's PID 1: when
that is a shell that does not forward signals, the ranks never see SIGTERM, but preStop still runs.
One process per node (local rank 0) answers the request file after the save, and answers it also
when training ends without saving, so preStop never waits out its timeout for nothing.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from ..contract import DONE_FILE, FAILED_FILE, REQUEST_FILE
from ..fsutil import write_atomic
from . import incarnation

log = logging.getLogger(__name__)


class SignalTrigger:
    """Sets `fired` on SIGTERM (or the given signals) and chains to a previous Python handler."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self.signals = signals
        self.fired = False
        self.fired_by: int | None = None
        self._previous: dict[int, Any] = {}
        self.installed = False

    def install(self) -> bool:
        """Install the handlers; False (and a log line) outside the main thread, where Python
        cannot install handlers: the request file still works there."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("kubeckpt: not in the main thread; SIGTERM will not trigger a checkpoint")
            return False
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        self.installed = True
        return True

    def uninstall(self, *, stopping: bool = False) -> None:
        """Give the signals back. `stopping`: training was stopped for a just-in-time checkpoint,
        so the process is on its way out; the SIGTERM a kubelet sends after preStop (or a second
        one) must not turn that clean exit into a 143. So the signal is then ignored (SIG_IGN,
        which, unlike a Python handler, the interpreter keeps while it shuts down: the kubelet's
        SIGTERM often lands there), or still chained to an earlier Python handler. The kubelet's
        SIGKILL at the end of the grace period still bounds the exit."""
        if not self.installed:
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) != self._handle:
                continue  # someone else's since: leave it
            if stopping:
                chain = callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN)
                signal.signal(sig, self._after_stop if chain else signal.SIG_IGN)
            else:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        if not stopping:
            self._previous.clear()
        self.installed = False

    def _after_stop(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.fired = True
        self.fired_by = signum
        previous = self._previous.get(signum)
        # SIG_DFL would terminate the process, which is exactly what we are preventing; SIG_IGN and
        # None (a handler installed from C) have nothing to call.
        if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
            previous(signum, frame)


class RequestFile:
    """The preStop side channel in $CHECKPOINT_CONTROL_DIR.

    `pending()` is one stat() per call; the request is read only when the stat changes. A
    request from an earlier container of the same pod (whose emptyDir survives a restart) is
    ignored: incarnation.py says how that is told without comparing clocks.
    """

    def __init__(self, control_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(control_dir)
        self.request = self.dir / REQUEST_FILE
        self.done = self.dir / DONE_FILE
        self.failed = self.dir / FAILED_FILE
        self.me = incarnation.current()
        # For a request without an identity: /proc's start time has clock-tick resolution;
        # allow a little slack.
        self.not_before = incarnation.process_start_time() - 0.05
        self._seen: tuple[tuple[int, int, int, int], bool] | None = None

    def pending(self) -> bool:
        try:
            st = os.stat(self.request)
        except OSError:
            return False
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if self._seen is None or self._seen[0] != key:
            self._seen = (key, self._for_me(st.st_mtime))
        return self._seen[1]

    def _for_me(self, mtime: float) -> bool:
        try:
            with open(self.request, "rb") as f:
                body = json.loads(f.read(4096))
        except (OSError, ValueError):
            body = None
        requester = incarnation.Incarnation.from_request(body)
        if requester is not None and self.me is not None:
            return self.me.may_ask(requester)
        return mtime >= self.not_before

    def acknowledge(self, ok: bool, detail: dict[str, Any] | None = None) -> None:
        """Answer preStop: `checkpoint-done` or `checkpoint-failed`, written atomically; then the
        request is removed, so a container restarted in the same pod does not stop at once."""
        target = self.done if ok else self.failed
        body = json.dumps({"time": time.time(), "pid": os.getpid(), **(detail or {})})
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_atomic(target, body.encode("utf-8") + b"\n")
            self.request.unlink(missing_ok=True)
        except OSError as e:
            log.error("kubeckpt: cannot acknowledge the checkpoint request in %s: %s", self.dir, e)


class Triggers:
    """Both triggers of one rank, and its answer to preStop."""

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
