"""Counts and times over a job's life, across the training processes that ran it. Pure.

A progress record describes one training process (an incarnation): its `checkpointsCreated`
counts from 0 in every process, and its step is where that process is. What survives the restart
of a pod and of this controller is the TrainingProgress status (decide reads the stored status
before it writes), so the life-long numbers are carried forward there, in `status.lifetime`, one
record at a time:

- Which process wrote a record: its `incarnation`, an id the runtime draws once per process. A
  record without one (an older runtime, a program writing the file itself, a termination message
  cut to 4 KiB) is taken as from a new process when it comes from another pod, names another
  checkpoint it resumed from, or counts fewer checkpoints than the process before it did.
- `checkpointsCreated`, over the job's life: what each process reported, summed. A record adds
  only its increase over what the status holds for its process: reading the same record twice
  adds nothing, a record with a lower count lowers nothing, a new process adds its count from 0.
  Not counted from the storage: retention deletes old checkpoints, and the storage is mounted in
  the pods, not here. A process's saves after the last record read of it are counted when its
  final record (the termination message) is read; else only the checkpoint the next process
  resumed from, when it is newer than the status's latest (the just-in-time save of a
  preemption). A process never read is not counted.
- `interruptions`: the processes after the first (a preemption, an eviction, a lost node, a
  crash, a suspension); `resumes`: the processes that name a checkpoint they resumed from.
- At an interruption, `stepsLost` is the old process's last step read minus the step the new one
  resumed at (that of the checkpoint it names, 0 when it started over), never below 0: a lower
  bound, as the old process may have gone on after its last read. `secondsLost` is the downtime
  plus the lost steps' time: the downtime runs from the old process's last record (its
  lastUpdateTime) to the new one's first step (its first record's time less the steps done since
  it resumed, at its step time, `stepSeconds`); the lost steps' time is `stepsLost` at the step
  time (0 while no step time is known). Neither counts what happened in no process's view (a
  queue wait before the first process). No interruption loses more time than the job has existed,
  nor do all of them together.

Every number is bounded (kubeckpt_api.status_bounds): counts saturate at MAX_COUNT, times at
MAX_LOST_SECONDS and at the job's age. A stored value that is not a number in range (another
writer of the status) is taken as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from kubeckpt_api import status_bounds as bounds
from kubeckpt_api.status_model import printable
from trainer_runtime.contract.preemption import checkpoint_step_value
from trainer_runtime.contract.progress import (
    MAX_INCARNATION_LENGTH,
    format_decimal,
    format_rfc3339,
    parse_rfc3339,
)

LIFETIME: Final = "lifetime"
LAST_INTERRUPTION: Final = "lastInterruption"


@dataclass(frozen=True)
class Interruption:
    """What one change of process cost."""

    last_step: int  # the old process's last step read
    resumed_step: int  # where the new process started again
    steps_lost: int
    downtime_seconds: float | None  # None: a time was missing
    seconds_lost: float

    def text(self) -> str:
        return f"{self.steps_lost} steps lost ({self.seconds_lost:.0f}s of training)"


@dataclass(frozen=True)
class Carried:
    lifetime: dict[str, Any]
    interruption: Interruption | None  # the record is the first of a new process


def incarnation_of(value: object) -> str | None:
    """The record's incarnation as the status keeps it (printable, bounded), or None."""
    if not isinstance(value, str) or not value:
        return None
    text = printable(value)
    return text[:MAX_INCARNATION_LENGTH]


def known_incarnation(status: Mapping[str, Any]) -> str | None:
    """The incarnation of the process the stored status was last read from, or None."""
    life = status.get(LIFETIME)
    return incarnation_of(life.get("incarnation")) if isinstance(life, Mapping) else None


def _time(value: object) -> datetime | None:
    try:
        return parse_rfc3339(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _add(total: int, more: int) -> int:
    return min(bounds.MAX_COUNT, total + more)


def _seconds(value: float) -> str:
    return format_decimal(value, 1)


def carry(
    prev: Mapping[str, Any],
    new: Mapping[str, Any],
    incarnation: str | None,
    *,
    other_pod: bool,
    now: datetime,
    job_created: datetime | None,
) -> Carried:
    """`status.lifetime` after a record is taken.

    `prev` is the stored status, `new` the record's status fields as decide takes them (checked by
    status_bounds, so a value out of range is absent), `incarnation` the record's (incarnation_of),
    `other_pod` whether the record comes from another pod than the last one read.
    """
    old = prev.get(LIFETIME)
    old = old if isinstance(old, Mapping) else None
    ck = new.get("checkpointing") or {}
    reported = bounds.count(ck.get("checkpointsCreated"))  # this process's count, or None
    if old is None:
        # The first record, or a status from before lifetime existed: its checkpointsCreated is
        # then the count of the process it was read from.
        prev_ck = prev.get("checkpointing") or {}
        before = bounds.count(prev_ck.get("checkpointsCreated") if prev_ck else None) or 0
        old = {"incarnationCheckpoints": before, "checkpointsCreated": before}
    counts = {key: bounds.count(old.get(key)) or 0 for key in bounds.LIFETIME_COUNTS}
    lost_total = bounds.lost_seconds(old.get("secondsLost")) or 0.0
    known = incarnation_of(old.get("incarnation"))
    first = bounds.count(prev.get("step")) is None  # no record of any process taken before
    if incarnation and known:
        new_process = incarnation != known
    else:
        new_process = (
            other_pod
            or new.get("resumedFrom") != prev.get("resumedFrom")
            or (reported is not None and reported < counts["incarnationCheckpoints"])
        )
    new_process = new_process and not first
    out: dict[str, Any] = {}
    if incarnation:
        out["incarnation"] = incarnation
    interruption = None
    if new_process:
        interruption = _interruption(prev, new, now=now, job_created=job_created)
        counts["interruptions"] = _add(counts["interruptions"], 1)
        counts["stepsLost"] = _add(counts["stepsLost"], interruption.steps_lost)
        lost_total += interruption.seconds_lost
        counts["incarnationCheckpoints"] = 0
        if _saved_unseen(prev, new):
            counts["checkpointsCreated"] = _add(counts["checkpointsCreated"], 1)
    if (first or new_process) and new.get("resumedFrom"):
        counts["resumes"] = _add(counts["resumes"], 1)
    if reported is not None and reported > counts["incarnationCheckpoints"]:
        more = reported - counts["incarnationCheckpoints"]
        counts["checkpointsCreated"] = _add(counts["checkpointsCreated"], more)
        counts["incarnationCheckpoints"] = reported
    out.update(counts)
    out["secondsLost"] = _seconds(min(lost_total, _cap(now, job_created)))
    if interruption is not None:
        out[LAST_INTERRUPTION] = _last(interruption, new, now)
    elif isinstance(last := old.get(LAST_INTERRUPTION), Mapping):
        out[LAST_INTERRUPTION] = _sane_last(last)
    return Carried(out, interruption)


def _saved_unseen(prev: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the checkpoint the new process resumed from is newer than any the status holds:
    the old process saved it after its last record read (a just-in-time save at a preemption,
    whose final record went with its pod), so it is counted once here."""
    resumed = checkpoint_step_value(new.get("resumedFrom"))
    if resumed is None:
        return False
    ck = prev.get("checkpointing")
    known = [
        int(step)
        for location in (
            ck.get("latestCheckpoint") if isinstance(ck, Mapping) else None,
            prev.get("resumedFrom"),  # the old process's own start
        )
        if (step := checkpoint_step_value(location)) is not None
    ]
    return not known or int(resumed) > max(known)


def _cap(now: datetime, job_created: datetime | None) -> float:
    """The most time a job can have lost: its age, within MAX_LOST_SECONDS."""
    if job_created is None:
        return bounds.MAX_LOST_SECONDS
    age = (now - job_created).total_seconds() + bounds.CLOCK_SKEW.total_seconds()
    return max(0.0, min(age, bounds.MAX_LOST_SECONDS))


def _interruption(
    prev: Mapping[str, Any], new: Mapping[str, Any], *, now: datetime, job_created: datetime | None
) -> Interruption:
    last_step = bounds.count(prev.get("step")) or 0
    step = bounds.count(new.get("step")) or 0
    resumed_from = new.get("resumedFrom")
    if not resumed_from:
        resumed_step = 0  # started over
    elif (name_step := checkpoint_step_value(resumed_from)) is not None:
        resumed_step = int(name_step)
    else:
        resumed_step = min(step, last_step)  # a name without a step: at most where it is now
    steps_lost = max(0, last_step - resumed_step)
    step_seconds = bounds.step_seconds(new.get("stepSeconds")) or bounds.step_seconds(
        prev.get("stepSeconds")
    )
    old_time, new_time = _time(prev.get("lastUpdateTime")), _time(new.get("lastUpdateTime"))
    downtime = None
    if old_time is not None and new_time is not None:
        done = max(0, step - resumed_step) * (step_seconds or 0.0)
        # Its first step: its first record's time less the steps done since it resumed.
        back = max(0.0, (new_time - old_time).total_seconds() - done)
        downtime = min(back, _cap(now, job_created))
    redo = steps_lost * (step_seconds or 0.0)
    lost = min((downtime or 0.0) + redo, _cap(now, job_created))
    return Interruption(last_step, resumed_step, steps_lost, downtime, lost)


def _last(i: Interruption, new: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    out: dict[str, Any] = {
        "time": new.get("lastUpdateTime") or format_rfc3339(now),
        "lastStep": i.last_step,
        "resumedStep": i.resumed_step,
        "stepsLost": i.steps_lost,
        "secondsLost": _seconds(i.seconds_lost),
    }
    if i.downtime_seconds is not None:
        out["downtimeSeconds"] = _seconds(i.downtime_seconds)
    return out


def _sane_last(last: Mapping[str, Any]) -> dict[str, Any]:
    """The stored lastInterruption, values out of range left out."""
    out: dict[str, Any] = {}
    if (when := _time(last.get("time"))) is not None:
        out["time"] = format_rfc3339(when)
    for key in bounds.LAST_INTERRUPTION_COUNTS:
        if (n := bounds.count(last.get(key))) is not None:
            out[key] = n
    for key in bounds.LAST_INTERRUPTION_SECONDS:
        if (s := bounds.lost_seconds(last.get(key))) is not None:
            out[key] = _seconds(s)
    return out


def life_checkpoints(lifetime: Mapping[str, Any]) -> int | None:
    """The job's checkpoints over its life from status.lifetime, or None."""
    return bounds.count(lifetime.get("checkpointsCreated"))
