"""What the webhook knows about the cluster: policies, namespaces and TrainingProgress, read from
informer caches so that no admission request waits on an API call.

A job's TrainingProgress (for its measured step and save times) is found by what it is about,
`spec.jobRef` (the kind, its API group, the job's name), never by its object name alone: a
PyTorchJob and a TrainJob may share a name in one namespace, and the second one's
TrainingProgress is then `<name>-<kind>`. Where the pod names its job's UID (a PyTorchJob's pods
are controlled by the job itself), only a TrainingProgress that job owns is taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from kubeckpt_api.jobkinds import JobIdentity, JobKind
from kubeckpt_api.status_identity import job_ref, owner_uid

JOB_REF_INDEX = "jobRef"


class ClusterView(Protocol):
    def synced(self) -> bool: ...

    def namespace(self, name: str) -> Mapping[str, Any] | None: ...

    def policies(self, namespace: str) -> list[Mapping[str, Any]]: ...

    def progress(
        self, namespace: str, job: JobIdentity, job_uid: str | None = None
    ) -> Mapping[str, Any] | None: ...


def job_ref_key(namespace: str, kind: JobKind, name: str) -> str:
    return f"{namespace}/{kind.group}/{kind.kind}/{name}"


def job_ref_index(tp: Mapping[str, Any]) -> list[str]:
    """The informer index of TrainingProgress by spec.jobRef: one key when the reference names a
    kind we serve, by an apiVersion of its group (`status_identity.job_ref`); none otherwise."""
    ref, meta = job_ref(tp), tp.get("metadata")
    if ref is None or not isinstance(meta, Mapping):
        return []
    return [job_ref_key(str(meta.get("namespace", "")), *ref)]


def choose_progress(
    candidates: Iterable[Mapping[str, Any]], job_uid: str | None
) -> Mapping[str, Any] | None:
    """Among the TrainingProgress objects whose jobRef names the job: the one the job (`job_uid`)
    owns when the UID is known (none: a TrainingProgress of an earlier job of that name, or of a
    forger, sizes nothing), else the first by name."""
    found = sorted(candidates, key=lambda tp: str((tp.get("metadata") or {}).get("name", "")))
    if job_uid is not None:
        found = [tp for tp in found if owner_uid(tp) == job_uid]
    return found[0] if found else None


class StaticView:
    """A fixed view (for unit tests and the benchmark's in-process handler)."""

    def __init__(
        self,
        namespaces: list[Mapping[str, Any]] = (),  # type: ignore[assignment]
        policies: list[Mapping[str, Any]] = (),  # type: ignore[assignment]
        progress: list[Mapping[str, Any]] = (),  # type: ignore[assignment]
    ) -> None:
        self._ns = {n["metadata"]["name"]: n for n in namespaces}
        self._pol = list(policies)
        self._tp = list(progress)

    def synced(self) -> bool:
        return True

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        return self._ns.get(name)

    def policies(self, namespace: str) -> list[Mapping[str, Any]]:
        return [p for p in self._pol if p["metadata"].get("namespace") == namespace]

    def progress(
        self, namespace: str, job: JobIdentity, job_uid: str | None = None
    ) -> Mapping[str, Any] | None:
        key = job_ref_key(namespace, job.job_kind, job.name)
        return choose_progress((t for t in self._tp if key in job_ref_index(t)), job_uid)
