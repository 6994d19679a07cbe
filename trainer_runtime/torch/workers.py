"""DataLoader worker processes that outlive the stop signal until the main process has saved.

torchrun sends SIGTERM to each rank's whole process group (`os.killpg`), and so does a shell that
forwards signals to its job: the DataLoader's worker processes get it too. They die of it (their
C handler prints and re-raises), the main process's SIGCHLD handler then raises "DataLoader
worker ... exited unexpectedly" at the next batch, and the just-in-time save never happens.

Workers have nothing to save, and they exit by themselves once the main process is gone (they
watch their parent), so kubeckpt makes them ignore SIGTERM:

- automatically, for workers forked after the manager is created (the default on Linux): the
  DataLoader's worker start-up (`_set_worker_signal_handlers`) is wrapped in this process, and a
  forked worker runs the wrapped one;
- with `worker_init_fn=survive_sigterm` (or `chain(fn)`) for workers started by spawn or
  forkserver, which import a fresh torch.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

_installed = False


def survive_sigterm(worker_id: int | None = None) -> None:
    """A DataLoader `worker_init_fn`: this worker ignores SIGTERM (runs after torch's handlers)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class chain:
    """`worker_init_fn=chain(fn)`: ignore SIGTERM, then run `fn(worker_id)` (picklable)."""

    def __init__(self, fn: Callable[[int], Any] | None) -> None:
        self.fn = fn

    def __call__(self, worker_id: int) -> None:
        survive_sigterm(worker_id)
        if self.fn is not None:
            self.fn(worker_id)


def install() -> None:
    """Make forked DataLoader workers of this process ignore SIGTERM. Idempotent."""
    global _installed
    if _installed:
        return
    from torch.utils.data._utils import signal_handling

    original = signal_handling._set_worker_signal_handlers

    def set_worker_signal_handlers(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        survive_sigterm()

    signal_handling._set_worker_signal_handlers = set_worker_signal_handlers
    _installed = True
