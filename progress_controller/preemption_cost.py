"""What preempting a job would cost, as the value of Kueue's KEP-7990 priority boost. Pure.

Kueue (v0.17, feature gate `PriorityBoost`, alpha) orders workloads and picks preemption victims
by `effectivePriority = spec.priority + boost`, where the boost is the Workload annotation
`kueue.x-k8s.io/priority-boost`, a signed decimal int32 (`strconv.ParseInt(v, 10, 32)`; missing
means 0, an empty or unparsable value is rejected by Kueue's Workload webhook). A lower effective
priority is preempted first, so the boost here is the cost of a preemption: 0 for a job that
loses nothing (it just committed a checkpoint), rising with the work it would lose and with the
time its save stalls it, up to `CostSettings.max_boost`.

The work lost is the steps since the latest committed checkpoint times the measured step time
(steps, not wall time, so that the time a resumed job spent suspended is not counted); while
either is unknown, the wall time since that checkpoint (or since the job started, when there is
none yet). The cost is that plus the measured save time. The boost grows with the logarithm of
the cost, so that one minute against ten matters as much as one hour against ten, and a busy
job's boost changes less and less often as the work since its checkpoint grows (fewer writes).

A job that is not running (Pending, Suspended) has nothing to lose and gets 0, the neutral value,
so that a boost earned while running does not move it ahead in the queue. A finished or unknown
job gets None: no write. So does a job whose status holds a value out of
`kubeckpt_api.status_bounds`' ranges that the cost needs: a number from a pod orders jobs across
the cluster only if it is believable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from kubeckpt_api import status_bounds as bounds
from trainer_runtime.contract.preemption import checkpoint_step_value
from trainer_runtime.contract.progress import parse_rfc3339

PRIORITY_BOOST_ANNOTATION: Final = "kueue.x-k8s.io/priority-boost"
# Kueue parses the annotation as an int32.
INT32_MAX: Final = 2**31 - 1

RUNNING_STATES: Final = frozenset({"Training", "Stalled"})
IDLE_STATES: Final = frozenset({"Pending", "Suspended"})


class CostSettingsError(ValueError):
    """Settings that cannot give a bounded, monotone boost."""


@dataclass(frozen=True)
class CostSettings:
    """How a cost in seconds becomes a boost.

    `max_boost` is the boost of a job whose preemption costs `horizon_seconds` or more. Kueue
    adds the boost to the Workload's priority, so a boost as large as the gap between two
    priority classes lets a cheap-to-lose low-priority job outrank a high one: keep it below the
    smallest gap that must hold (the default, 100, suits classes 1000 apart). `unit_seconds` is
    the cost at which the boost reaches about a tenth of its maximum with the other defaults.
    """

    max_boost: int = 100
    horizon_seconds: float = 86400.0
    unit_seconds: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_boost, bool) or not isinstance(self.max_boost, int):
            raise CostSettingsError(f"max_boost must be an integer, not {self.max_boost!r}")
        if not 1 <= self.max_boost <= INT32_MAX:
            raise CostSettingsError(f"max_boost must be in 1..{INT32_MAX}, not {self.max_boost}")
        for name in ("horizon_seconds", "unit_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise CostSettingsError(f"{name} must be a finite number > 0, not {value!r}")
        if self.unit_seconds >= self.horizon_seconds:
            raise CostSettingsError("unit_seconds must be less than horizon_seconds")


@dataclass(frozen=True)
class JobProgress:
    """What the controller knows about one job, from its TrainingProgress status."""

    state: str
    now: datetime
    started: datetime | None = None  # the job's creationTimestamp
    step: int | None = None
    checkpoint_step: int | None = None  # None: no complete checkpoint yet
    checkpoint_time: datetime | None = None
    step_seconds: float | None = None  # None: not measured yet
    save_seconds: float | None = None


# The status fields the cost reads; one out of range means no write.
_USED: Final = (
    ("step",),
    ("stepSeconds",),
    ("checkpointing", "latestCheckpoint"),
    ("checkpointing", "latestCheckpointTime"),
    ("checkpointing", "lastSaveSeconds"),
)


_SAVE: Final = ("checkpointing", "lastSaveSeconds")


def _get(fields: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = fields
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def progress_from_status(
    status: Mapping[str, Any], *, now: datetime, started: datetime | None
) -> JobProgress | None:
    """The job's progress from its TrainingProgress status, or None when a value the cost reads
    is out of range (status_bounds.check refuses it and says so) or the status has no state.

    A value that check leaves out without a word is taken as absent, as the status itself holds
    it: the time of the checkpoint a re-created job resumed from, which predates the job.
    """
    state = status.get("state")
    if not isinstance(state, str):
        return None
    used = {path[0]: status[path[0]] for path in _USED if path[0] in status}
    checked, problems = bounds.check(used, now=now, job_created=started)
    refused = {problem.field for problem in problems}
    if any(".".join(path) in refused for path in _USED):
        return None
    latest = _get(checked, ("checkpointing", "latestCheckpoint"))
    checkpoint_step = None
    if latest:
        step_text = checkpoint_step_value(latest)
        if step_text is None:
            return None  # a checkpoint whose step cannot be read: the lost work is unknown
        checkpoint_step = int(step_text)
    when = _get(checked, ("checkpointing", "latestCheckpointTime"))
    save = _get(checked, ("checkpointing", "lastSaveSeconds"))
    return JobProgress(
        state=state,
        now=now,
        started=started,
        step=checked.get("step"),
        checkpoint_step=checkpoint_step,
        checkpoint_time=parse_rfc3339(when) if latest and isinstance(when, str) else None,
        step_seconds=bounds.step_seconds(checked.get("stepSeconds")),
        save_seconds=None if save is None else bounds.in_range(_SAVE, save),
    )


def lost_seconds(p: JobProgress) -> float | None:
    """The work a preemption now would lose, in seconds of training, or None when unknown."""
    base_step = p.checkpoint_step if p.checkpoint_step is not None else 0
    if p.step is not None and p.step_seconds is not None:
        if p.step < base_step:
            return None  # the status contradicts itself: not a basis for ordering jobs
        return (p.step - base_step) * p.step_seconds
    since = p.checkpoint_time if p.checkpoint_step is not None else p.started
    if since is None:
        return None
    return max(0.0, (p.now - since).total_seconds())


def cost_seconds(p: JobProgress) -> float | None:
    """The cost of preempting the job now: the work lost plus the save that stalls it."""
    lost = lost_seconds(p)
    if lost is None:
        return None
    return lost + (p.save_seconds or 0.0)


def boost_for_cost(cost: float, settings: CostSettings = CostSettings()) -> int:
    """The boost for a cost in seconds: 0 for none, growing with its logarithm, at most
    `max_boost` (reached at `horizon_seconds`). Non-decreasing in `cost`."""
    if math.isnan(cost) or cost <= 0:
        return 0
    if cost >= settings.horizon_seconds:
        return settings.max_boost
    scale = math.log1p(settings.horizon_seconds / settings.unit_seconds)
    fraction = math.log1p(cost / settings.unit_seconds) / scale
    return min(settings.max_boost, math.floor(settings.max_boost * fraction))


def priority_boost(p: JobProgress, settings: CostSettings = CostSettings()) -> int | None:
    """The value for the job's Workload annotation, or None: write nothing (the job is finished
    or its state unknown, or the work it would lose is unknown)."""
    if p.state in IDLE_STATES:
        return 0
    if p.state not in RUNNING_STATES:
        return None
    cost = cost_seconds(p)
    return None if cost is None else boost_for_cost(cost, settings)


def boost_value(boost: int) -> str:
    """The annotation's text for a boost: a decimal int32, as Kueue parses it."""
    if not -INT32_MAX - 1 <= boost <= INT32_MAX:
        raise ValueError(f"a priority boost is an int32, not {boost}")
    return str(boost)
