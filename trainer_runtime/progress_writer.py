"""Rank 0's progress file ($TRAINING_PROGRESS_FILE) and the final termination message.

Writes are atomic (temp file, fsync, rename) so the reconciler's `cat` never sees half a record, and
never raise into the training loop: a full or read-only disk costs visibility, not the job.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from pathlib import Path
from typing import Any

from .contract import (
    LATEST_CHECKPOINT_REASON,
    MAX_ERROR_LENGTH,
    MAX_STRING_LENGTH,
    REASON_JIT,
    REASON_PERIODIC,
    REASON_RESUME,
    RESUMED_TIER,
    CheckpointingStatus,
    ProgressRecord,
    format_decimal,
    format_duration,
    format_rfc3339,
)
from .contract.progress import UNVERIFIABLE_CHECKPOINTS
from .fsutil import write_atomic
from .progress_push import ProgressPusher

log = logging.getLogger(__name__)

# Optional record fields a training loop may report through `metrics`.
_METRIC_FIELDS = {
    "accuracy": "accuracy",
    "validationLoss": "validation_loss",
    "validationAccuracy": "validation_accuracy",
}


def _decimal(value: Any, digits: int) -> str | None:
    if value is None:
        return None
    try:
        number = float(value)  # a 0-dim tensor converts here, only on write steps
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number):
        return None
    return format_decimal(number, digits)


class ProgressWriter:
    def __init__(
        self,
        path: str,
        *,
        enabled: bool,
        every: int,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        checkpointing_enabled: bool = False,
        termination_log: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.enabled = enabled
        self.every = max(1, every)
        self.total_steps = total_steps
        self.total_epochs = total_epochs
        self.termination_log = termination_log
        self.resumed_from: str | None = None
        # One id per process: every record says which process wrote it, so the controller counts
        # a restart once and adds this process's checkpointsCreated (from 0) to the job's total.
        self.incarnation = uuid.uuid4().hex
        self.checkpointing = CheckpointingStatus(
            enabled=checkpointing_enabled, checkpoints_created=0
        )
        self._record: ProgressRecord | None = None
        self._warned = False
        self.writes = 0
        # Set when the webhook injected the push endpoint (progress.push); else None.
        self.pusher = ProgressPusher.from_env() if enabled else None

    # --- state the manager feeds in ---

    def checkpoint_saved(
        self,
        location: str,
        *,
        save_seconds: float,
        stall_seconds: float | None,
        reason: str = REASON_PERIODIC,
    ) -> None:
        c = self.checkpointing
        c.latest_checkpoint = location
        c.checkpoints_created = (c.checkpoints_created or 0) + 1
        c.latest_checkpoint_time = format_rfc3339()
        c.last_save_seconds = format_decimal(max(0.0, save_seconds), 3)
        if stall_seconds is not None:
            c.last_stall_seconds = format_decimal(max(0.0, stall_seconds), 4)
        c.extra[LATEST_CHECKPOINT_REASON] = reason

    def local_checkpoint_saved(self, location: str) -> None:
        c = self.checkpointing
        c.latest_local_checkpoint = location
        c.local_checkpoints_created = (c.local_checkpoints_created or 0) + 1

    def checkpoint_failed(self, step: int, error: str) -> None:
        """A save (or a stop's save) that did not happen, and why, for `kubectl describe`."""
        c = self.checkpointing
        c.failed_saves = (c.failed_saves or 0) + 1
        c.last_failed_step = max(0, step)
        c.last_error = error[:MAX_ERROR_LENGTH]

    def resume_refused(self, reason: str, message: str) -> None:
        """Checkpoints restore passed over, which the controller shows as the condition
        CheckpointsUnverifiable: `reason` (CheckpointsUnverifiable, UnsupportedFormatVersion,
        StartedFresh) and which and why, cut to the record's string limit."""
        self.checkpointing.extra[UNVERIFIABLE_CHECKPOINTS] = {
            "reason": reason,
            "message": message[:MAX_STRING_LENGTH],
        }

    def checkpoint_was_jit(self) -> None:
        """The latest checkpoint is also the just-in-time one (a stop at a step already saved)."""
        if self.checkpointing.latest_checkpoint:
            self.checkpointing.extra[LATEST_CHECKPOINT_REASON] = REASON_JIT

    def resumed(
        self, name: str, location: str, saved_time: str | None = None, tier: str | None = None
    ) -> None:
        """Resumed from `location` (`name` = checkpoint-<step>): until this process saves, that is
        the latest checkpoint, so `kubectl get tp` does not go blank after every restart."""
        self.resumed_from = name
        c = self.checkpointing
        c.latest_checkpoint = location
        c.latest_checkpoint_time = saved_time
        c.extra[LATEST_CHECKPOINT_REASON] = REASON_RESUME
        if tier is not None:
            c.extra[RESUMED_TIER] = tier

    def build(
        self,
        step: int,
        *,
        epoch: int | None = None,
        loss: Any = None,
        learning_rate: Any = None,
        step_seconds: float | None = None,
        eta_seconds: float | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> ProgressRecord:
        percent = None
        if self.total_steps:
            percent = format_decimal(min(100.0, 100.0 * step / self.total_steps), 1)
        record = ProgressRecord(
            step=step,
            epoch=epoch,
            total_epochs=self.total_epochs,
            total_steps=self.total_steps,
            loss=_decimal(loss, 4),
            learning_rate=_decimal(learning_rate, 6),
            percent_complete=percent,
            estimated_time_remaining=(
                format_duration(round(eta_seconds)) if eta_seconds is not None else None
            ),
            step_seconds=format_decimal(step_seconds, 3) if step_seconds is not None else None,
            last_update_time=format_rfc3339(),
            resumed_from=self.resumed_from,
            incarnation=self.incarnation,
            checkpointing=self.checkpointing,
        )
        for key, value in (metrics or {}).items():
            attr = _METRIC_FIELDS.get(key)
            if attr is not None:
                setattr(record, attr, _decimal(value, 4))
        return record

    def due(self, step: int) -> bool:
        return self.enabled and step % self.every == 0

    def write(self, record: ProgressRecord) -> bool:
        """Write `record` to the progress file now; False (logged once) when it cannot be."""
        self._record = record
        if not self.enabled:
            return False
        if self.pusher is not None:
            self.pusher.offer(record.to_json().encode("utf-8"))  # background; never blocks
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, record.to_json(indent=1).encode("utf-8"))
        except (OSError, ValueError) as e:
            if not self._warned:
                log.warning("kubeckpt: cannot write progress file %s: %s", self.path, e)
                self._warned = True
            return False
        self.writes += 1
        return True

    def write_final(self, record: ProgressRecord | None = None) -> None:
        """The last record to the progress file and its short form to the termination log."""
        record = record or self._record
        if record is None or not self.enabled:
            return
        self.write(record)
        if not self.termination_log:
            return
        try:
            message = record.to_termination_message().encode("ascii")
            # Not atomic on purpose: /dev/termination-log is a file the kubelet mounts; it cannot be
            # renamed over. The kubelet reads it only after the container has exited.
            fd = os.open(self.termination_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, message)
            finally:
                os.close(fd)
        except (OSError, ValueError) as e:
            log.warning("kubeckpt: cannot write termination log %s: %s", self.termination_log, e)
