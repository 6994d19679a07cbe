"""Whether and what to write to a Kueue Workload's priority-boost annotation. Pure: the
controller (preemption_cost_controller.py) only sends the applies this decides.

Which Workload is whose job: Kueue's job framework creates one Workload per job, controlled by
the job (ctrl.SetControllerReference in pkg/controller/jobframework/reconciler.go
ConstructWorkload) and labelled `kueue.x-k8s.io/job-uid`; the label can be missing (a UID that is
not a label value), the controller ownerReference cannot, so a Workload is a job's when its
controller ownerReference names a job kind we serve with the job's UID.

The writer's rule (`decide`): the annotation is written only when our field manager owns it or
nobody does (managedFields), never when another field manager owns it: an admin or another
controller that sets the boost wins, and the API server backs this, as we apply without force (a
field another manager owns is a 409). No write when the value is what the Workload already has
(a missing annotation is 0 to Kueue). To keep writes rare (each is an API write and a Kueue
requeue of the ClusterQueue's heads):

- a change smaller than `min_change` is not written (the measured step time wobbles from poll
  to poll), unless the new value is 0;
- a fall (the job committed a checkpoint, or stopped) is written at once: it is what Kueue needs
  soonest, as it makes the job a cheaper victim, and it happens once per checkpoint;
- a rise is written only when our last write (the `time` of our managedFields entry) is at
  least `min_interval` seconds old. The boost grows with the logarithm of the work at risk, so
  a running job's value rises by `min_change` ever more rarely: a handful of writes per
  checkpoint interval.

Kueue's own status writes echo the annotation: Kueue v0.17 applies a Workload's status
(admission, eviction: pkg/workload BaseSSAWorkload) with every annotation and label of the
Workload as it read them, on the status subresource. The API server keeps the annotation's value
(a status write cannot change metadata) but records the status entry as a co-owner, so an
unforced apply of a new value is a 409 against `kueue-admission` (seen on the first eviction of a
job whose boost we had written). Such an entry is not a writer: it is left out of the rule above,
and a write over it is forced (`Decision.force`), which takes only that echo's share of the one
annotation. A writer on the main resource (an admin's patch, another controller) still stops us.
The echo is forced too, so an echo from a cache behind ours (Kueue just restarted) takes our
entry's share while the server keeps our value: then nobody but the echo owns a right value, and
it is left so (no write), until the value must change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from kubeckpt_api.jobkinds import JOB_KINDS, JobKind
from trainer_runtime.contract.progress import parse_rfc3339

from .preemption_cost import PRIORITY_BOOST_ANNOTATION, boost_value

FIELD_MANAGER: Final = "kubeckpt-preemption-cost"
WORKLOAD_GROUP: Final = "kueue.x-k8s.io"
WORKLOAD_VERSION: Final = "v1beta2"  # Kueue v0.17's storage version
WORKLOAD_API_VERSION: Final = f"{WORKLOAD_GROUP}/{WORKLOAD_VERSION}"
WORKLOAD_PLURAL: Final = "workloads"
JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"

Action = Literal["write", "unchanged", "foreign", "no-value", "not-yet"]


@dataclass(frozen=True)
class WriteRule:
    """How often a changed value is written (see the module's docstring)."""

    min_change: int = 5
    min_interval: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.min_change, bool) or not isinstance(self.min_change, int):
            raise ValueError(f"min_change must be an integer, not {self.min_change!r}")
        if self.min_change < 1 or not self.min_interval >= 0:
            raise ValueError("min_change must be >= 1 and min_interval >= 0")


@dataclass(frozen=True)
class Decision:
    action: Action
    value: str | None = None  # what to apply, for "write"
    owners: tuple[str, ...] = ()  # the other field managers, for "foreign"
    after: float | None = None  # for "not-yet": seconds until the rate rule allows a write
    # For "write": a status-subresource entry echoes the annotation (see the module's
    # docstring), so the apply must be forced to take it from that echo.
    force: bool = False

    @property
    def write(self) -> bool:
        return self.action == "write"


@dataclass(frozen=True)
class WorkloadJob:
    """The job a Workload belongs to, by its controller ownerReference."""

    kind: JobKind
    name: str
    uid: str


def workload_job(workload: Mapping[str, Any]) -> WorkloadJob | None:
    """The training job that controls this Workload, or None (another kind, no controller)."""
    refs = (workload.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if not isinstance(ref, Mapping) or ref.get("controller") is not True:
            continue
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        name, uid = ref.get("name"), ref.get("uid")
        for kind in JOB_KINDS:
            if kind.kind == ref.get("kind") and kind.group == group:
                if isinstance(name, str) and name and isinstance(uid, str) and uid:
                    return WorkloadJob(kind, name, uid)
        return None  # the one controller is not a training job
    return None


def _owns(fields: Any, key: str) -> bool:
    if not isinstance(fields, Mapping):
        return False
    annotations = (fields.get("f:metadata") or {}).get("f:annotations")
    return isinstance(annotations, Mapping) and f"f:{key}" in annotations


def _owning_entries(
    workload: Mapping[str, Any], key: str, *, subresource: bool
) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for entry in (workload.get("metadata") or {}).get("managedFields") or []:
        if not isinstance(entry, Mapping) or bool(entry.get("subresource")) != subresource:
            continue
        if entry.get("fieldsType", "FieldsV1") != "FieldsV1":
            continue
        if _owns(entry.get("fieldsV1"), key):
            manager = str(entry.get("manager", ""))
            when = entry.get("time")
            out[manager] = when if isinstance(when, str) else None
    return out


def annotation_managers(
    workload: Mapping[str, Any], key: str = PRIORITY_BOOST_ANNOTATION
) -> dict[str, str | None]:
    """Field managers that own annotation `key`, each with the time of its entry (None if the
    entry has none). A status-subresource entry cannot change metadata and is skipped (see
    `status_echoes`)."""
    return _owning_entries(workload, key, subresource=False)


def status_echoes(
    workload: Mapping[str, Any], key: str = PRIORITY_BOOST_ANNOTATION
) -> tuple[str, ...]:
    """Field managers whose status-subresource entry owns annotation `key`: they sent it back
    unchanged with a status write (Kueue does), and cannot change it."""
    return tuple(sorted(_owning_entries(workload, key, subresource=True)))


def _current(workload: Mapping[str, Any]) -> str | None:
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(PRIORITY_BOOST_ANNOTATION)
    return value if isinstance(value, str) else None


def _as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def decide(
    workload: Mapping[str, Any],
    boost: int | None,
    *,
    now: datetime,
    rule: WriteRule = WriteRule(),
    manager: str = FIELD_MANAGER,
) -> Decision:
    """What to do with the Workload's annotation, for the wanted `boost` (None: nothing to
    write, see preemption_cost.priority_boost)."""
    owners = annotation_managers(workload)
    others = tuple(sorted(m for m in owners if m != manager))
    if others:
        return Decision("foreign", owners=others)
    if boost is None:
        return Decision("no-value")
    value = boost_value(boost)
    have = _current(workload)
    if have == value or (have is None and boost == 0):  # Kueue reads a missing boost as 0
        return Decision("unchanged")
    write = Decision("write", value, force=bool(status_echoes(workload)))
    current = _as_int(have)
    if current is None or boost == 0:
        return write
    if abs(boost - current) < rule.min_change:
        return Decision("not-yet")
    if boost < current:
        return write
    last = owners.get(manager)
    if last is not None:
        try:
            age = (now - parse_rfc3339(last)).total_seconds()
        except ValueError:
            age = rule.min_interval
        if age < rule.min_interval:
            return Decision("not-yet", after=rule.min_interval - max(0.0, age))
    return write


def trim_workload(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The Workload as far as the controller reads it (an informer transform): its metadata,
    with only the boost annotation and only the managedFields entries that own it (status
    echoes included). A Workload holds its job's pod templates; a cache of thousands of them
    would be most of the memory."""
    md = dict(workload.get("metadata") or {})
    annotations = md.get("annotations")
    if isinstance(annotations, Mapping) and PRIORITY_BOOST_ANNOTATION in annotations:
        md["annotations"] = {PRIORITY_BOOST_ANNOTATION: annotations[PRIORITY_BOOST_ANNOTATION]}
    else:
        md.pop("annotations", None)
    entries = md.get("managedFields")
    if isinstance(entries, list):
        md["managedFields"] = [
            {k: e[k] for k in ("manager", "operation", "time", "subresource") if k in e}
            | {"fieldsType": "FieldsV1", "fieldsV1": _ANNOTATION_FIELDS}
            for e in entries
            if isinstance(e, Mapping)
            and e.get("fieldsType", "FieldsV1") == "FieldsV1"
            and _owns(e.get("fieldsV1"), PRIORITY_BOOST_ANNOTATION)
        ]
    return {"apiVersion": workload.get("apiVersion"), "kind": workload.get("kind"), "metadata": md}


_ANNOTATION_FIELDS: Final = {
    "f:metadata": {"f:annotations": {f"f:{PRIORITY_BOOST_ANNOTATION}": {}}}
}


def applied_configuration(workload: Mapping[str, Any], value: str) -> dict[str, Any]:
    """The server-side apply body that owns exactly the annotation on this Workload."""
    md = workload.get("metadata") or {}
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": md.get("name"),
            "namespace": md.get("namespace"),
            "annotations": {PRIORITY_BOOST_ANNOTATION: value},
        },
    }
