"""TrainingProgress status: its conditions, their vocabulary, and the one-word state.

What the status means is the API's: the controller writes it (progress_controller.decide decides
the values), the CLI reads it, and a status written by an older controller must read the same.
The fields a progress record gives are fitted to the CRD's schema by status_model.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from trainer_runtime.contract.progress import format_rfc3339

from .status_model import printable

# Condition types.
PROGRESSING, STALLED, CHECKPOINTING, COMPLETED = (
    "Progressing",
    "Stalled",
    "Checkpointing",
    "Completed",
)
INJECTED = "Injected"  # only once a pod of the job was created without injection
# Only once a pod carried the job's labels without being the job's own (ForeignPod).
PODS_OWNED = "PodsOwned"
# Only once a record held a value out of range (kubeckpt_api.status_bounds: not used).
VALUES_IN_RANGE = "ValuesInRange"
# Only once a training process found checkpoints of which none verifies (issue 27): the runtime
# names them (the record's checkpointing.unverifiableCheckpoints, trainer_runtime/contract).
CHECKPOINTS_UNVERIFIABLE = "CheckpointsUnverifiable"
MAX_CONDITION_MESSAGE = 1024
# Every value of `status.state` (the STATE column), as `state_of` derives it.
STATES = ("Pending", "Training", "Stalled", "Suspended", "Succeeded", "Failed", "Unknown")


def condition(conds: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conds if c.get("type") == type_), None)


def set_condition(
    conds: list[dict[str, Any]], type_: str, status: str, reason: str, message: str, now: datetime
) -> list[dict[str, Any]]:
    """A new list with `type_` set; lastTransitionTime kept unless the status changed."""
    message = printable(message)
    if len(message) > MAX_CONDITION_MESSAGE:
        message = message[: MAX_CONDITION_MESSAGE - 3] + "..."
    old = condition(conds, type_)
    when = (
        old["lastTransitionTime"]
        if old is not None and old.get("status") == status and old.get("lastTransitionTime")
        else format_rfc3339(now)
    )
    new = {
        "type": type_,
        "status": status,
        "lastTransitionTime": when,
        "reason": reason,
        "message": message,
    }
    return [c for c in conds if c.get("type") != type_] + [new]


# Reasons of Progressing=Unknown that only mean "nothing to read yet" while no step was ever read.
_NOT_YET = frozenset({"NoRank0Pod", "ProgressFileMissing"})


def state_of(status: dict[str, Any]) -> str:
    """One word for `status.state` (the STATE column), from the conditions: what `kubectl get tp`
    users scan for, so the outcome and Suspended/Stalled win over a plain Training."""
    conds = status.get("conditions") or []
    completed = condition(conds, COMPLETED) or {}
    progressing = condition(conds, PROGRESSING) or {}
    stalled = condition(conds, STALLED) or {}
    if completed.get("status") == "True":
        return "Succeeded"
    if completed.get("status") == "False" and completed.get("reason") == "JobFailed":
        return "Failed"
    if progressing.get("status") == "False" and progressing.get("reason") == "Suspended":
        return "Suspended"
    if stalled.get("status") == "True":
        return "Stalled"
    if progressing.get("status") == "True":
        return "Training"
    if progressing.get("status") == "Unknown":
        if progressing.get("reason") in _NOT_YET and status.get("step") is None:
            return "Pending"
        return "Unknown"
    return "Pending"
