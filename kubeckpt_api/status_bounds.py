"""Sane bounds on the numbers a progress record reports, declared once for the cluster side.

A progress record is written by user code in a training pod, yet its numbers size things outside
that pod: the controller's poll interval and stall window (`stepSeconds`), the webhook's grace
period (`stepSeconds`, `lastSaveSeconds`), a TrainJob's `status.trainerStatus`
(`percentComplete`, `estimatedTimeRemaining`), and the pods' last-checkpoint annotations that a
scheduler compares across jobs (`latestCheckpointTime`, the step in `latestCheckpoint`). The
contract (trainer_runtime.contract.progress) checks only the form: a finite non-negative decimal,
an int64, an RFC 3339 time. These are the ranges in which a value is believable. A value outside
is not used: `check` leaves it out of the status fields (every reader then takes it as absent, so
the defaults apply) and says why, for a condition on the TrainingProgress. Nothing here raises.

Values that only describe the run (loss, learning rate, accuracy) size nothing and are not
bounded beyond the contract's form.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from trainer_runtime.contract.env import parse_duration
from trainer_runtime.contract.preemption import checkpoint_step_value
from trainer_runtime.contract.progress import LATEST_CHECKPOINT_REASON, REASON_RESUME, parse_rfc3339

# An optimizer step longer than an hour is not a measurement to size polling or a grace by.
MAX_STEP_SECONDS: Final = 3600.0
# A checkpoint save (or the training stall it causes) longer than a day.
MAX_SAVE_SECONDS: Final = 86400.0
# A run with more than a year left.
MAX_ETA_SECONDS: Final = 366 * 86400.0
# Counts (steps, epochs, checkpoints): exact as a float, as metrics and JSON readers in
# JavaScript hold them (the contract's own bound is int64).
MAX_COUNT: Final = 2**53 - 1
# How far a node's clock may be from the controller's before a time it reports is not believed.
CLOCK_SKEW: Final = timedelta(minutes=5)
# The longest time between two progress writes that polling and stall detection honour
# (stepSeconds x PROGRESS_UPDATE_FREQUENCY, both from the pod): a longer claimed period is cut
# to this, so a job is read at least this often and is Stalled after 3 such periods.
MAX_UPDATE_PERIOD: Final = 3600.0

# The life-long numbers the controller derives from records and carries in status.lifetime
# (progress_controller/lifetime.py): counts saturate at MAX_COUNT, a time lost at this (and at the
# job's age, when known: a job cannot lose more time than it has existed).
MAX_LOST_SECONDS: Final = 10 * 366 * 86400.0
LIFETIME_COUNTS: Final = (
    "checkpointsCreated",
    "incarnationCheckpoints",
    "interruptions",
    "resumes",
    "stepsLost",
)
LIFETIME_SECONDS: Final = ("secondsLost",)
LAST_INTERRUPTION_COUNTS: Final = ("lastStep", "resumedStep", "stepsLost")
LAST_INTERRUPTION_SECONDS: Final = ("downtimeSeconds", "secondsLost")

Path = tuple[str, ...]

# Decimal strings that size something: (low, high), both included.
DECIMAL_RANGES: Final[Mapping[Path, tuple[float, float]]] = {
    ("stepSeconds",): (0.0, MAX_STEP_SECONDS),
    ("percentComplete",): (0.0, 100.0),
    ("checkpointing", "lastSaveSeconds"): (0.0, MAX_SAVE_SECONDS),
    ("checkpointing", "lastStallSeconds"): (0.0, MAX_SAVE_SECONDS),
}
COUNT_FIELDS: Final[tuple[Path, ...]] = (
    ("step",),
    ("totalSteps",),
    ("epoch",),
    ("totalEpochs",),
    ("checkpointing", "checkpointsCreated"),
    ("checkpointing", "failedSaves"),
    ("checkpointing", "lastFailedStep"),
    ("checkpointing", "localCheckpointsCreated"),
)
TIME_FIELDS: Final[tuple[Path, ...]] = (
    ("lastUpdateTime",),
    ("checkpointing", "latestCheckpointTime"),
)
ETA: Final[Path] = ("estimatedTimeRemaining",)
LATEST_CHECKPOINT: Final[Path] = ("checkpointing", "latestCheckpoint")

_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class OutOfRange:
    """A value left out, and why (for the condition's message)."""

    field: str  # the status path, dotted: "checkpointing.lastSaveSeconds"
    value: str
    why: str  # "is over 3600", "is in the future", ...

    def message(self) -> str:
        value = self.value if len(self.value) <= 40 else self.value[:37] + "..."
        return f"{self.field} {value} {self.why}"


def _decimal(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str) and len(value) <= 64 and _DECIMAL_RE.fullmatch(value):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def in_range(path: Path, value: object) -> float | None:
    """`value` as a number when it is a decimal within the range of field `path`, else None."""
    number = _decimal(value)
    low, high = DECIMAL_RANGES[path]
    return number if number is not None and low <= number <= high else None


def step_seconds(value: object) -> float | None:
    """stepSeconds as a positive number of seconds when it is in range (0 means not measured)."""
    number = in_range(("stepSeconds",), value)
    return number if number else None


def count(value: object) -> int | None:
    """`value` when it is a count in 0..MAX_COUNT, else None (a status another writer spoiled)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
    return value if ok else None


def lost_seconds(value: object) -> float | None:
    """A time lost (a decimal string of seconds) in 0..MAX_LOST_SECONDS, else None."""
    number = _decimal(value)
    return number if number is not None and 0 <= number <= MAX_LOST_SECONDS else None


def eta_seconds(text: object) -> float | None:
    """estimatedTimeRemaining in seconds when it is plain seconds or a Go duration within
    [0, MAX_ETA_SECONDS]; None otherwise (the field is free text: an unreadable value is just
    unknown)."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    number = _decimal(text)
    if number is None:
        try:
            number = parse_duration(text)
        except ValueError:
            return None
    return number if math.isfinite(number) and 0 <= number <= MAX_ETA_SECONDS else None


def _fmt(low: float, high: float) -> str:
    return f"{low:g}..{high:g}"


def _decimal_problem(path: Path, value: object) -> str | None:
    if in_range(path, value) is not None:
        return None
    number = _decimal(value)
    low, high = DECIMAL_RANGES[path]
    if number is None:
        return "is not a finite decimal"
    return f"is outside {_fmt(low, high)}"


def _time_problem(
    value: object,
    now: datetime,
    job_created: datetime | None,
    *,
    may_predate_job: bool = False,
) -> tuple[str | None, bool]:
    """(why the time is refused or None, whether to say so)."""
    try:
        moment = parse_rfc3339(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None:
        return "is not an RFC 3339 time", True
    if moment > now + CLOCK_SKEW:
        return "is in the future", True
    if job_created is not None and moment < job_created - CLOCK_SKEW:
        # A job re-created under the same name resumes from its predecessor's checkpoint: that
        # time is true, but the job has lost nothing from before it existed. Not put on its
        # pods, and not worth a condition.
        return "is before the job was created", not may_predate_job
    return None, True


def _get(fields: Mapping[str, Any], path: Path) -> Any:
    value: Any = fields
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _drop(fields: dict[str, Any], path: Path) -> None:
    parent: Any = fields
    for key in path[:-1]:
        parent = parent.get(key) if isinstance(parent, dict) else None
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


def check(
    fields: Mapping[str, Any], *, now: datetime, job_created: datetime | None = None
) -> tuple[dict[str, Any], list[OutOfRange]]:
    """The status fields of one record (status_model.record_fields) with every value out of range
    left out, and what was left out (in field order).

    `now` is the controller's clock and `job_created` the job's creationTimestamp (None: unknown,
    no lower bound): a time later than now, or earlier than the job, is not believed, give or
    take CLOCK_SKEW.
    """
    out: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in fields.items()}
    problems: list[OutOfRange] = []

    def refuse(path: Path, value: object, why: str, *, report: bool = True) -> None:
        _drop(out, path)
        if report:
            problems.append(OutOfRange(".".join(path), str(value), why))

    for path in COUNT_FIELDS:
        value = _get(out, path)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
            refuse(path, value, f"is outside 0..{MAX_COUNT}")
    for path in DECIMAL_RANGES:
        value = _get(out, path)
        if value is not None and (why := _decimal_problem(path, value)) is not None:
            refuse(path, value, why)
    eta = _get(out, ETA)
    if isinstance(eta, str) and (_decimal(eta) is not None or _is_duration(eta)):
        if eta_seconds(eta) is None:
            refuse(ETA, eta, f"is outside 0..{MAX_ETA_SECONDS:g} seconds")
    resumed = _get(out, ("checkpointing", LATEST_CHECKPOINT_REASON)) == REASON_RESUME
    for path in TIME_FIELDS:
        value = _get(out, path)
        if value is None:
            continue
        why, report = _time_problem(
            value, now, job_created, may_predate_job=resumed and path[-1] == "latestCheckpointTime"
        )
        if why is not None:
            refuse(path, value, why, report=report)
    latest = _get(out, LATEST_CHECKPOINT)
    if isinstance(latest, str):
        step = checkpoint_step_value(latest)
        if step is not None and int(step) > MAX_COUNT:
            refuse(LATEST_CHECKPOINT, latest, f"names a step outside 0..{MAX_COUNT}")
    return out, problems


def _is_duration(text: str) -> bool:
    try:
        parse_duration(text)
    except ValueError:
        return False
    return True
