"""The last-checkpoint annotations on a job's pods, for checkpoint-aware preemption. Pure: what
every pod of a job should carry, from the TrainingProgress status, and the merge patch that makes
one pod carry it, from that pod's current annotations; the controller only sends the patches.

Names and value forms: trainer_runtime.contract.preemption.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.objects import KubeObject
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_ANNOTATIONS,
    LAST_CHECKPOINT_STEP_ANNOTATION,
    LAST_CHECKPOINT_TIME_ANNOTATION,
    checkpoint_step_value,
    checkpoint_time_value,
)

# Phases in which a pod holds no resources: no scheduler preempts it, so it is not written.
_DONE_PHASES = frozenset({"Succeeded", "Failed"})


def wanted(status: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The annotations every pod of the job should carry, from its TrainingProgress status.

    None when the status says nothing about checkpoints (no `checkpointing`: no record yet, or a
    writer that does not report them): pods are then left as they are. Otherwise the parts of
    the latest complete checkpoint that are known, each in the contract's one form (a value from
    the progress file that has none is left out); {} when there is no complete checkpoint
    (none yet, or checkpointing disabled), so that a pod drops values that no longer hold.
    """
    ck = (status or {}).get("checkpointing")
    if not isinstance(ck, Mapping):
        return None
    latest = ck.get("latestCheckpoint")
    if not latest:
        return {}
    out: dict[str, str] = {}
    if (when := checkpoint_time_value(ck.get("latestCheckpointTime"))) is not None:
        out[LAST_CHECKPOINT_TIME_ANNOTATION] = when
    if (step := checkpoint_step_value(latest)) is not None:
        out[LAST_CHECKPOINT_STEP_ANNOTATION] = step
    return out


def pod_patch(want: Mapping[str, str] | None, pod: KubeObject) -> dict[str, str | None] | None:
    """The `metadata.annotations` of a merge patch that makes `pod` carry `want` (None removes a
    key), or None when it already does or is not written.

    The pod gets exactly the status's values, even where its own look newer: the status is the
    one place that decides which checkpoint is the latest (it refuses a step that goes back
    without a resume), so pods never disagree with `kubectl get tp`. A newer value on a pod
    can only be a hand edit, or one a corrected record has since replaced (kept, a far-future
    time from a buggy writer would stay for good), or one from a node whose clock ran ahead of
    the replacement rank 0's (kept, the job's pods would disagree).
    """
    if want is None:
        return None
    md = pod.get("metadata") or {}
    if md.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in _DONE_PHASES:
        return None  # going or gone: no longer a preemption candidate
    have = md.get("annotations") or {}
    patch = {
        key: want.get(key) for key in LAST_CHECKPOINT_ANNOTATIONS if have.get(key) != want.get(key)
    }
    return patch or None
