"""Pure functions over pod and job objects: which pod is rank 0, which container, which path.

What a job kind's pods look like (the labels naming the job and rank 0, the training container)
is declared once, in trainer_runtime.contract.jobkinds (read here through kubeckpt_api.jobkinds);
the webhook reads the same table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubeckpt_api.jobkinds import JOB_KINDS, PYTORCHJOB, TRAINJOB, JobKind, job_identity
from kubeckpt_api.optin import INJECTED_LABEL, STATUS_ANNOTATION
from kubeckpt_api.status_identity import job_ref
from reconciler.objects import KubeObject
from trainer_runtime.contract.progress import parse_rfc3339

__all__ = ["JOB_KINDS", "PYTORCHJOB", "TRAINJOB", "JobKind"]

PROGRESS_ENV = "TRAINING_PROGRESS_FILE"
UPDATE_FREQUENCY_ENV = "PROGRESS_UPDATE_FREQUENCY"
DEFAULT_PROGRESS_PATH = "/workspace/training_progress.json"  # the runtime's default when unset
DEFAULT_UPDATE_FREQUENCY = 5


def _labels(obj: KubeObject) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def job_of_pod(pod: KubeObject) -> tuple[JobKind, str] | None:
    """(kind, name) of the training job a pod claims to belong to, from its labels; None if none.
    A claim only: ownership.py decides whether the job owns it."""
    ident = job_identity(_labels(pod))
    return (ident.job_kind, ident.name) if ident else None


def job_key(kind: JobKind, namespace: str, name: str) -> str:
    """The controller's key of a job: "ns/name" for a PyTorchJob (as it always was), and
    "ns/_<kind lowercase>/name" for every other kind, the scheme of the jobs' checkpoint
    directories. A leading underscore is never a job name, so same-named jobs of two kinds never
    share a key (their TrainingProgress, state and Events stay apart)."""
    if kind is PYTORCHJOB:
        return f"{namespace}/{name}"
    return f"{namespace}/_{kind.kind.lower()}/{name}"


_BY_SEGMENT = {f"_{k.kind.lower()}": k for k in JOB_KINDS if k is not PYTORCHJOB}


def parse_job_key(key: str) -> tuple[JobKind, str, str] | None:
    """(kind, namespace, name) of a key `job_key` made; None for anything else."""
    namespace, _, rest = key.partition("/")
    segment, sep, name = rest.partition("/")
    if not sep:
        return (PYTORCHJOB, namespace, rest) if rest else None
    kind = _BY_SEGMENT.get(segment)
    return (kind, namespace, name) if kind is not None and name else None


def pod_job_key(pod: KubeObject) -> str | None:
    """The key of the job a pod's labels name."""
    job = job_of_pod(pod)
    if job is None:
        return None
    return job_key(job[0], str((pod.get("metadata") or {}).get("namespace", "")), job[1])


def progress_job_key(tp: KubeObject) -> str | None:
    """The key of the job a TrainingProgress's spec.jobRef names."""
    ref = job_ref(tp)
    if ref is None:
        return None
    return job_key(ref[0], str((tp.get("metadata") or {}).get("namespace", "")), ref[1])


def is_rank0(pod: KubeObject, kind: JobKind = PYTORCHJOB) -> bool:
    return kind.is_rank0(_labels(pod))


def _deleting(pod: KubeObject) -> bool:
    return "deletionTimestamp" in (pod.get("metadata") or {})


def _created(pod: KubeObject) -> tuple[str, str]:
    """A pod's place in creation order (RFC 3339 in UTC sorts as text; the name breaks ties)."""
    md = pod.get("metadata") or {}
    return str(md.get("creationTimestamp", "")), str(md.get("name", ""))


def rank0_pod(pods: list[KubeObject], kind: JobKind = PYTORCHJOB) -> KubeObject | None:
    """The job's rank-0 pod: of several (an old one terminating, its replacement), the one not
    being deleted, then the newest."""
    candidates = [p for p in pods if is_rank0(p, kind)]
    if not candidates:
        return None
    return max(candidates, key=lambda p: (not _deleting(p), *_created(p)))


def has_record_to_read(pod: KubeObject, kind: JobKind = PYTORCHJOB) -> bool:
    """Whether a pod may still tell something: its container runs (its file, by exec or push)
    or has terminated with a termination message (its final record)."""
    container = target_container(pod, kind)
    if container is None:
        return False
    cs = container_state(pod, str(container.get("name", "")))
    return cs.state == "running" or (cs.state == "terminated" and bool(cs.message.strip()))


def read_order(
    pods: list[KubeObject],
    kind: JobKind = PYTORCHJOB,
    observed: str | None = None,
    observed_uid: str | None = None,
) -> list[KubeObject]:
    """The rank-0 pods to read in one reconcile, in the order their records are taken; the last
    is `rank0_pod`'s (the replacement, whose state schedules the job), [] when there is none.

    Before it come the older rank-0 pods being deleted that may still tell something
    (`has_record_to_read`), oldest first: a pod deleted for preemption writes its just-in-time
    checkpoint and the record announcing it (progress file, then termination message) while a
    Job's replacement is already there, Pending, with nothing to read. Taken in this order, a
    newer pod's record always comes after an older pod's, so the replacement's wins.

    `observed` is the stored status's observedPod, the pod whose record was taken last; once it
    is the replacement, the pods before it are not read again: a victim's record is never taken
    after its replacement's (whose step may be lower: it resumed from an older checkpoint). Nor
    is a pod older than the observed one. Pods in the API never share a name, but a pod already
    gone (its last state kept by the caller) and its same-named replacement (a PyTorchJob's) do:
    `observed_uid`, the UID of the pod whose record was taken last when known, tells them apart;
    without it the newest of that name is taken as the observed one, so nothing is read that
    could come after it."""
    main = rank0_pod(pods, kind)
    if main is None:
        return []
    ranked = [
        *sorted(
            (
                p
                for p in pods
                if p is not main
                and is_rank0(p, kind)
                and _deleting(p)
                and _created(p) < _created(main)
            ),
            key=_created,
        ),
        main,
    ]
    named = [i for i, p in enumerate(ranked) if _meta(p, "name") == observed]
    if observed is not None and named:
        exact = [i for i in named if observed_uid and _meta(ranked[i], "uid") == observed_uid]
        ranked = ranked[(exact or named)[-1] :]
    return [*(p for p in ranked[:-1] if has_record_to_read(p, kind)), main]


def _meta(pod: KubeObject, field: str) -> str:
    return str((pod.get("metadata") or {}).get(field, ""))


def injected(pod: KubeObject) -> bool:
    return _labels(pod).get(INJECTED_LABEL) == "true"


def target_container(pod: KubeObject, kind: JobKind = PYTORCHJOB) -> dict[str, Any] | None:
    """The container the webhook injected (its status annotation names it), else the kind's
    default (`pytorch`, `node`), else the first."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        return None
    by_name = {c.get("name"): c for c in containers}
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(STATUS_ANNOTATION)
    if ann:
        try:
            name = json.loads(ann).get("container")
        except (ValueError, AttributeError):
            name = None
        if name in by_name:
            return by_name[name]
    return by_name.get(kind.target_container, containers[0])


def _env_value(container: dict[str, Any], name: str) -> str | None:
    for e in container.get("env") or []:
        if e.get("name") == name and "value" in e:
            return str(e["value"])
    return None


def progress_path(container: dict[str, Any]) -> str:
    """$TRAINING_PROGRESS_FILE as the pod spec sets it (a literal value), else the default."""
    return _env_value(container, PROGRESS_ENV) or DEFAULT_PROGRESS_PATH


def update_frequency(container: dict[str, Any]) -> int:
    """Steps between progress writes ($PROGRESS_UPDATE_FREQUENCY, default 5)."""
    try:
        n = int(_env_value(container, UPDATE_FREQUENCY_ENV) or DEFAULT_UPDATE_FREQUENCY)
    except ValueError:
        return DEFAULT_UPDATE_FREQUENCY
    return n if n > 0 else DEFAULT_UPDATE_FREQUENCY


@dataclass(frozen=True)
class ContainerState:
    state: str  # "running", "terminated", "waiting" or "unknown"
    message: str = ""  # the termination message when terminated
    exit_code: int | None = None
    restart_count: int = 0


def container_state(pod: KubeObject, container: str) -> ContainerState:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        state = cs.get("state") or {}
        restarts = int(cs.get("restartCount") or 0)
        if "running" in state:
            return ContainerState("running", restart_count=restarts)
        if "terminated" in state:
            t = state["terminated"] or {}
            return ContainerState(
                "terminated", str(t.get("message") or ""), t.get("exitCode"), restarts
            )
        return ContainerState("waiting", restart_count=restarts)
    return ContainerState("unknown")


def job_outcome(job: KubeObject) -> str | None:
    """ "Succeeded" or "Failed" when the job has finished (its status conditions), else None."""
    conds = (job.get("status") or {}).get("conditions") or []
    for c in conds:
        if c.get("status") == "True" and c.get("type") in ("Succeeded", "Complete"):
            return "Succeeded"
    for c in conds:
        if c.get("status") == "True" and c.get("type") == "Failed":
            return "Failed"
    return None


def created(job: KubeObject) -> datetime | None:
    """The job's creationTimestamp, when it has a readable one."""
    try:
        return parse_rfc3339((job.get("metadata") or {}).get("creationTimestamp") or "")
    except ValueError:
        return None


def suspended(job: KubeObject, kind: JobKind) -> bool:
    """Whether the job's suspend field (its kind's, e.g. spec.suspend) is true."""
    value: Any = job
    for key in kind.suspend_field:
        value = value.get(key) if isinstance(value, dict) else None
    return value is True
