"""The controller's decision: the TrainingProgress status to store and the events a change means,
from the status already stored and one observation. Pure: a restarted controller makes the same
decisions (and sends no duplicate events) as the one before it.

The conditions, their vocabulary and the state are the API's (kubeckpt_api.status); the record's
fields are fitted to the CRD's schema by kubeckpt_api.status_model. Every condition has a reason
and a message.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubeckpt_api import status_bounds as bounds
from kubeckpt_api.status import (
    CHECKPOINTING,
    CHECKPOINTS_UNVERIFIABLE,
    COMPLETED,
    INJECTED,
    MAX_CONDITION_MESSAGE,
    PODS_OWNED,
    PROGRESSING,
    STALLED,
    VALUES_IN_RANGE,
    condition,
    set_condition,
    state_of,
)
from kubeckpt_api.status_model import RECORD_KEYS, printable, record_fields
from trainer_runtime.contract.progress import (
    LATEST_CHECKPOINT_REASON,
    REASON_JIT,
    REASON_RESUME,
    UNVERIFIABLE_CHECKPOINTS,
    ProgressRecord,
    format_rfc3339,
    parse_rfc3339,
)

from . import lifetime
from .kueue_eviction import Eviction

# The field manager of everything the controller writes with server-side apply (the
# TrainingProgress status, CheckpointPolicy status, a TrainJob's status.trainerStatus).
FIELD_MANAGER = "kubeckpt"
NOT_INJECTED_PREFIX = "created without kubeckpt injection (was the webhook down?): "
FOREIGN_PREFIX = "ignored, not owned by the job although they carry its labels: "


def changed(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether writing `new` over `old` changes anything but lastPollTime."""

    def norm(s: dict[str, Any] | None) -> dict[str, Any]:
        s = dict(s or {})
        s.pop("lastPollTime", None)
        s["conditions"] = sorted(s.get("conditions") or [], key=lambda c: c.get("type", ""))
        return s

    return norm(old) != norm(new)


@dataclass
class Observation:
    """What one reconcile saw."""

    pod: str | None = None  # the rank-0 pod read (or that should have been)
    record: ProgressRecord | None = None
    source: str | None = None  # "exec" or "terminationMessage"
    error_reason: str | None = None
    error_message: str = ""
    outcome: str | None = None  # "Succeeded" / "Failed" when the job finished
    stall_after: float | None = None  # seconds without a step before Stalled
    new_pod: bool = False  # a pod other than the one last read, even if it has the same name
    # Pods that should have been injected and were not (None: not known, leave the condition).
    not_injected: list[str] | None = None
    # The job is suspended (its kind's suspend field: Kueue preempts that way), not finished.
    suspended: bool = False
    # The job's creationTimestamp: a time the record reports from before it is not believed.
    job_created: datetime | None = None
    # Pods that carry the job's labels but that the job does not own (ownership.py), by name,
    # with why (None: not known, leave the condition).
    foreign: dict[str, str] | None = None
    # Kueue's eviction of the suspended job (its Workload's conditions), and the preempting job
    # by name when Kueue named one (kueue_eviction.describe_preemptor).
    eviction: Eviction | None = None
    preemptor: str | None = None


@dataclass(frozen=True)
class Event:
    type: str  # Normal / Warning
    reason: str
    message: str

    def __post_init__(self) -> None:
        # Built from a progress file's strings: escaped and bounded like condition messages.
        message = printable(self.message)
        if len(message) > MAX_CONDITION_MESSAGE:
            message = message[: MAX_CONDITION_MESSAGE - 3] + "..."
        object.__setattr__(self, "message", message)


@dataclass
class Decision:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    accepted: bool = False  # the record was taken (its values are in the status)


def _step_of(status: dict[str, Any]) -> int | None:
    step = status.get("step")
    return step if isinstance(step, int) else None


def _checkpoint_events(
    ck: dict[str, Any], prev_ck: dict[str, Any], step: int, obs: Observation
) -> list[Event]:
    """CheckpointSaved or JITCheckpoint, once per checkpoint. The runtime says why it saved
    (`latestCheckpointReason`); a record without it (an older runtime) is taken as a JIT save
    when it came from the termination message of a job that has not succeeded."""
    latest = ck.get("latestCheckpoint")
    if not latest:
        return []
    # The step from the checkpoint's own name: the record's step may be later when it is read.
    at = _checkpoint_step(latest)
    at_step = f"step {at}" if at is not None else f"step {step} or before"
    jit = Event("Normal", "JITCheckpoint", f"checkpoint on shutdown at {at_step}: {latest}")
    reason = ck.get(LATEST_CHECKPOINT_REASON)
    new_path = latest != prev_ck.get("latestCheckpoint")
    if reason == REASON_RESUME:
        return []  # the checkpoint resumed from: the Resumed event tells of it
    if reason == REASON_JIT and (new_path or prev_ck.get(LATEST_CHECKPOINT_REASON) != REASON_JIT):
        # A stop at a step already saved turns that checkpoint into the JIT one: say so once.
        return [jit]
    if not new_path:
        return []
    if reason is None and obs.source == "terminationMessage" and obs.outcome != "Succeeded":
        return [jit]
    return [Event("Normal", "CheckpointSaved", f"checkpoint at {at_step}: {latest}")]


def _failed_save_events(
    ck: dict[str, Any], prev_ck: dict[str, Any], *, same_process: bool
) -> list[Event]:
    """CheckpointFailed, once per failed save (a periodic one, or the stop's): the runtime counts
    its process's failures (`failedSaves`) and says why (`lastError`). The message names the
    checkpoint the next resume comes from, since that is what the failure costs."""
    failed = ck.get("failedSaves")
    if not isinstance(failed, int) or failed <= 0:
        return []
    before = prev_ck.get("failedSaves") if same_process else 0
    if isinstance(before, int) and failed <= before:
        return []
    at = ck.get("lastFailedStep")
    where = f" at step {at}" if isinstance(at, int) else ""
    why = ck.get("lastError") or "no reason given"
    latest = ck.get("latestCheckpoint")
    then = f"; a resume comes from {latest}" if latest else "; no checkpoint to resume from yet"
    return [Event("Warning", "CheckpointFailed", f"a save failed{where}: {why}{then}")]


# The reasons the runtime gives (trainer_runtime/protocol/resume_outcome.py); any other string
# from a pod is not used as a reason (a condition's reason is a CamelCase word).
UNVERIFIABLE_REASONS = frozenset(
    {"CheckpointsUnverifiable", "UnsupportedFormatVersion", "StartedFresh"}
)


def _unverifiable(
    conds: list[dict[str, Any]], rec: ProgressRecord, now: datetime
) -> tuple[list[dict[str, Any]], list[Event]]:
    """CheckpointsUnverifiable from the record: True (with a Warning Event, once per message)
    when the process found checkpoints of which none verifies, naming them (the runtime's text,
    escaped and bounded by set_condition); False once a later process's record no longer says so.
    Absent while nothing was ever found."""
    ck = rec.checkpointing
    raw = ck.extra.get(UNVERIFIABLE_CHECKPOINTS) if ck is not None else None
    old = condition(conds, CHECKPOINTS_UNVERIFIABLE)
    if isinstance(raw, dict) and isinstance(raw.get("message"), str) and raw["message"]:
        reason = raw.get("reason")
        reason = reason if reason in UNVERIFIABLE_REASONS else "CheckpointsUnverifiable"
        conds = set_condition(conds, CHECKPOINTS_UNVERIFIABLE, "True", reason, raw["message"], now)
        new = condition(conds, CHECKPOINTS_UNVERIFIABLE)
        assert new is not None
        if old is not None and old.get("status") == "True" and old.get("message") == new["message"]:
            return conds, []
        return conds, [Event("Warning", reason, new["message"])]
    if old is not None and old.get("status") == "True":
        msg = "the running process found no unverifiable checkpoints"
        conds = set_condition(conds, CHECKPOINTS_UNVERIFIABLE, "False", "NoneFound", msg, now)
    return conds, []


def _checkpoint_step(location: str) -> int | None:
    name = location.rstrip("/").rsplit("/", 1)[-1]
    prefix, _, number = name.rpartition("-")
    return int(number) if prefix == "checkpoint" and number.isdigit() else None


def decide(prev: dict[str, Any] | None, obs: Observation, now: datetime) -> Decision:
    """The status to store and the events to send, from the stored status and an observation."""
    prev = copy.deepcopy(prev or {})
    status: dict[str, Any] = dict(prev)
    conds: list[dict[str, Any]] = list(prev.get("conditions") or [])
    events: list[Event] = []
    accepted = False
    rec = obs.record
    error = (obs.error_reason, obs.error_message) if obs.error_reason else None

    if rec is not None:
        # Values out of range are left out (never used) and named in ValuesInRange.
        new, out_of_range = bounds.check(record_fields(rec), now=now, job_created=obs.job_created)
        prev_step = _step_of(prev)
        same_pod = obs.pod is not None and obs.pod == prev.get("observedPod") and not obs.new_pod
        # A record from another process of the same pod (a container restart) may go back.
        known = lifetime.known_incarnation(prev)
        incarnation = lifetime.incarnation_of(rec.incarnation)
        same_process = same_pod and (not known or not incarnation or known == incarnation)
        same_resume = new.get("resumedFrom") == prev.get("resumedFrom")
        if "step" not in new:
            error = (
                "ValueOutOfRange",
                f"the record's step is out of range ({_out_of_range_text(out_of_range)}); "
                "keeping the last good values",
            )
        elif prev_step is not None and rec.step < prev_step and same_process and same_resume:
            error = (
                "StepWentBackwards",
                f"step went back from {prev_step} to {rec.step} in pod {obs.pod} without a new "
                "resumedFrom or a new process; keeping the last good values",
            )
        else:
            accepted = True
            if any(p.field == "lastUpdateTime" for p in out_of_range):
                # Stalled is measured from it: when this controller saw the step change instead.
                same_step = rec.step == prev_step and prev.get("lastUpdateTime")
                new["lastUpdateTime"] = prev["lastUpdateTime"] if same_step else format_rfc3339(now)
            status = {k: v for k, v in prev.items() if k not in RECORD_KEYS}
            status.update(new)
            status["source"] = obs.source or "exec"
            if obs.pod:
                status["observedPod"] = obs.pod[:253]
            carried = _carry_lifetime(status, prev, new, rec, obs, now)
            resumed = bool(new.get("resumedFrom")) and not same_resume
            went_back = prev_step is not None and rec.step < prev_step
            if resumed or (went_back and not same_process):
                frm = new.get("resumedFrom") or "an earlier checkpoint"
                lost = f"; {carried.interruption.text()}" if carried.interruption else ""
                events.append(
                    Event("Normal", "Resumed", f"resumed from {frm}; step {rec.step}{lost}")
                )
            total = f" of {new['totalSteps']}" if new.get("totalSteps") else ""
            if resumed:
                conds = set_condition(
                    conds,
                    PROGRESSING,
                    "True",
                    "Resumed",
                    f"resumed from {new['resumedFrom']}; step {rec.step}{total}",
                    now,
                )
            else:
                conds = set_condition(
                    conds, PROGRESSING, "True", "ProgressReported", f"step {rec.step}{total}", now
                )
            ck = new.get("checkpointing") or {}
            prev_ck = prev.get("checkpointing") or {}
            latest = ck.get("latestCheckpoint")
            if ck.get("enabled") is False:
                conds = set_condition(
                    conds,
                    CHECKPOINTING,
                    "False",
                    "CheckpointingDisabled",
                    "checkpointing is disabled in the training container",
                    now,
                )
            elif latest:
                conds = set_condition(
                    conds,
                    CHECKPOINTING,
                    "True",
                    "CheckpointSaved",
                    f"latest complete checkpoint: {latest}",
                    now,
                )
            elif ck:
                conds = set_condition(
                    conds,
                    CHECKPOINTING,
                    "False",
                    "NoCheckpointYet",
                    "no complete checkpoint has been written yet",
                    now,
                )
            events += _checkpoint_events(ck, prev_ck, rec.step, obs)
            events += _failed_save_events(ck, prev_ck, same_process=same_process)
            # Stalled clears when the step advances.
            if prev_step is None or rec.step != prev_step:
                if (c := condition(conds, STALLED)) is not None and c.get("status") == "True":
                    conds = set_condition(
                        conds, STALLED, "False", "StepAdvanced", f"step {rec.step}", now
                    )

        conds, told = _unverifiable(conds, rec, now)
        events += told

        if out_of_range:
            conds = set_condition(
                conds,
                VALUES_IN_RANGE,
                "False",
                "ValueOutOfRange",
                f"not used: {_out_of_range_text(out_of_range)}",
                now,
            )
        elif accepted and (c := condition(conds, VALUES_IN_RANGE)) is not None:
            if c.get("status") != "True":
                conds = set_condition(
                    conds,
                    VALUES_IN_RANGE,
                    "True",
                    "ValuesInRange",
                    "every value of the last record is in range",
                    now,
                )

    if error is not None:
        reason, message = error
        conds = set_condition(conds, PROGRESSING, "Unknown", reason, message, now)
        if obs.pod and "observedPod" not in status:
            status["observedPod"] = obs.pod[:253]

    # Stalled: no step for longer than expected, while the job runs.
    if obs.outcome is None and obs.stall_after is not None and status.get("lastUpdateTime"):
        try:
            age = (now - parse_rfc3339(status["lastUpdateTime"])).total_seconds()
        except ValueError:
            age = 0.0
        if age > obs.stall_after:
            old = condition(conds, STALLED)
            if old is None or old.get("status") != "True":
                msg = (
                    f"no step since {status['lastUpdateTime']} (step {status.get('step')}); "
                    f"expected one within {obs.stall_after:.0f}s"
                )
                conds = set_condition(conds, STALLED, "True", "NoStepAdvance", msg, now)
                events.append(Event("Warning", "Stalled", msg))
        elif condition(conds, STALLED) is None:
            conds = set_condition(conds, STALLED, "False", "StepAdvanced", "steps advance", now)

    if obs.suspended and obs.outcome is None:
        latest = (status.get("checkpointing") or {}).get("latestCheckpoint")
        then = f"; it resumes from {latest} when unsuspended" if latest else ""
        msg = f"the job is suspended at step {status.get('step', 0)}{then}"
        if obs.eviction is not None:
            # Kueue's part first: a long checkpoint path cut at the end never cuts the key.
            msg = f"{obs.eviction.describe(obs.preemptor)}; {msg}"
            old = condition(prev.get("conditions") or [], PROGRESSING)
            told = (
                old is not None
                and old.get("reason") == "Suspended"
                and str(old.get("message", "")).startswith(obs.eviction.key + " ")
            )
            if not told:
                events.append(Event("Normal", "Evicted", msg))
        conds = set_condition(conds, PROGRESSING, "False", "Suspended", msg, now)
        if (c := condition(conds, STALLED)) is not None and c.get("status") == "True":
            conds = set_condition(conds, STALLED, "False", "Suspended", msg, now)

    if obs.outcome == "Succeeded":
        old = condition(conds, COMPLETED)
        msg = f"training finished at step {status.get('step', 0)}"
        if old is None or old.get("status") != "True":
            events.append(Event("Normal", "Completed", msg))
            conds = set_condition(conds, COMPLETED, "True", "JobSucceeded", msg, now)
        conds = set_condition(conds, PROGRESSING, "False", "Completed", msg, now)
        if (c := condition(conds, STALLED)) is not None and c.get("status") == "True":
            conds = set_condition(conds, STALLED, "False", "Completed", msg, now)
    elif obs.outcome == "Failed":
        conds = set_condition(
            conds,
            COMPLETED,
            "False",
            "JobFailed",
            f"the job failed at step {status.get('step', 0)}",
            now,
        )
        conds = set_condition(conds, PROGRESSING, "False", "JobFailed", "the job failed", now)

    if obs.not_injected is not None:
        old = condition(conds, INJECTED)
        if obs.not_injected:
            names = sorted(obs.not_injected)
            known = _listed(old, "False", NOT_INJECTED_PREFIX)
            new_names = [n for n in names if n not in known]
            conds = set_condition(
                conds,
                INJECTED,
                "False",
                "PodsNotInjected",
                NOT_INJECTED_PREFIX + ", ".join(names),
                now,
            )
            if new_names:
                events.append(
                    Event(
                        "Warning",
                        "NotInjected",
                        f"pod(s) {', '.join(new_names)} {NOT_INJECTED_PREFIX}they run without "
                        "checkpoint settings until recreated",
                    )
                )
        elif old is not None:
            conds = set_condition(
                conds, INJECTED, "True", "AllPodsInjected", "every pod of the job is injected", now
            )

    if obs.foreign is not None:
        conds, foreign_events = _foreign_pods(conds, obs.foreign, now)
        events += foreign_events

    order = {
        PROGRESSING: 0,
        STALLED: 1,
        CHECKPOINTING: 2,
        COMPLETED: 3,
        INJECTED: 4,
        PODS_OWNED: 5,
        VALUES_IN_RANGE: 6,
        CHECKPOINTS_UNVERIFIABLE: 7,
    }
    status["conditions"] = sorted(conds, key=lambda c: order.get(c["type"], 9))
    status["state"] = state_of(status)
    status["lastPollTime"] = format_rfc3339(now)
    return Decision(status, events, accepted)


def _carry_lifetime(
    status: dict[str, Any],
    prev: dict[str, Any],
    new: dict[str, Any],
    rec: ProgressRecord,
    obs: Observation,
    now: datetime,
) -> lifetime.Carried:
    """Put the job's life-long counts (lifetime.py) in the status being built from a record taken:
    `status.lifetime`, and `checkpointing.checkpointsCreated` as the count over the job's life
    (the record's is its process's)."""
    last_pod = prev.get("observedPod")
    other_pod = obs.new_pod or (
        obs.pod is not None and isinstance(last_pod, str) and obs.pod[:253] != last_pod
    )
    carried = lifetime.carry(
        prev,
        new,
        lifetime.incarnation_of(rec.incarnation),
        other_pod=other_pod,
        now=now,
        job_created=obs.job_created,
    )
    status[lifetime.LIFETIME] = carried.lifetime
    total = carried.lifetime["checkpointsCreated"]
    ck = status.get("checkpointing")
    if isinstance(ck, dict) or total:
        status["checkpointing"] = {**(ck or {}), "checkpointsCreated": total}
    return carried


def _out_of_range_text(problems: list[bounds.OutOfRange]) -> str:
    return "; ".join(p.message() for p in problems)


def _listed(cond: dict[str, Any] | None, status: str, prefix: str) -> set[str]:
    """The names a condition of ours lists after `prefix` (those already reported)."""
    if cond is None or cond.get("status") != status:
        return set()
    text = str(cond.get("message", ""))
    return set(text[len(prefix) :].split(", ")) if text.startswith(prefix) else set()


def _foreign_pods(
    conds: list[dict[str, Any]], foreign: dict[str, str], now: datetime
) -> tuple[list[dict[str, Any]], list[Event]]:
    """PodsOwned and one ForeignPod Event for the pods not reported before (the stored
    condition lists them, so a restarted controller does not report them again)."""
    old = condition(conds, PODS_OWNED)
    if not foreign:
        if old is None or old.get("status") == "True":
            return conds, []
        msg = "every pod that carries the job's labels is the job's own"
        return set_condition(conds, PODS_OWNED, "True", "AllPodsOwned", msg, now), []
    names = sorted(foreign)
    known = _listed(old, "False", FOREIGN_PREFIX)
    conds = set_condition(
        conds, PODS_OWNED, "False", "ForeignPod", FOREIGN_PREFIX + ", ".join(names), now
    )
    new = {n: foreign[n] for n in names if n not in known}
    return conds, [foreign_event(new)] if new else []


def foreign_event(foreign: dict[str, str]) -> Event:
    """The ForeignPod Event for pods (by name, with why) that carry the job's labels and are not
    its own: one Event for all of them, so that many forged pods are not many Events."""
    why = "; ".join(f"{name}: {foreign[name]}" for name in sorted(foreign))
    return Event(
        "Warning",
        "ForeignPod",
        f"ignored pod(s) that carry this job's labels but are not its own ({why}): they drive "
        "nothing of the job's progress, Events or annotations",
    )
