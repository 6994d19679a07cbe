"""What every framework adapter exposes of the protocol's state, written once.

The torch and JAX managers (and any later one) keep a `Checkpointer` in `_ckpt` and add only
their framework's staging, formats and restore; these read-only views and the context manager
are the same for all of them.
"""

from __future__ import annotations

from typing import Any, Self

from ..contract import PREEMPTED_EXIT_CODE, checkpoint_dir_name
from ..storage import LocalTier, Tier
from .checkpointer import Checkpointer
from .session import SaveResult


class AdapterBase:
    """Base of a framework's CheckpointManager: the protocol's state, read-only."""

    _ckpt: Checkpointer

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def persistent(self) -> Tier | None:
        return self._ckpt.persistent

    @property
    def local(self) -> LocalTier | None:
        return self._ckpt.local

    @property
    def progress(self) -> Any:
        return self._ckpt.progress

    @property
    def stopped(self) -> bool:
        return self._ckpt.stopped

    @property
    def last_result(self) -> SaveResult | None:
        return self._ckpt.last_result

    @property
    def last_error(self) -> str | None:
        return self._ckpt.last_error

    @property
    def failed_saves(self) -> int:
        return self._ckpt.failed_saves

    @property
    def resumed_from(self) -> str | None:
        """ "checkpoint-<step>" this process resumed from."""
        restored = self._ckpt.resumed
        return checkpoint_dir_name(restored.step) if restored else None

    @property
    def resumed_tier(self) -> str | None:
        """ "local" or "persistent"."""
        restored = self._ckpt.resumed
        return restored.tier.name if restored else None

    @property
    def exit_code(self) -> int:
        """What the training process should exit with: 0, or PREEMPTED_EXIT_CODE (143) after a
        just-in-time stop, so that the job controller restarts the job instead of counting the
        preempted pod a success (`return mgr.exit_code` at the end of the script)."""
        return PREEMPTED_EXIT_CODE if self.stopped else 0
