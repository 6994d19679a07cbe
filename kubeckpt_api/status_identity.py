"""Which TrainingProgress is a job's, and the name a new one gets.

A TrainingProgress is named after its job, but names alone do not tell jobs apart: a PyTorchJob
and a TrainJob may share a name in one namespace. So whatever looks a job's TrainingProgress up
(the controller, the webhook sizing a grace period, the CLI) matches `spec.jobRef` (the kind, its
API group, the name), never the object's name alone; the controller also checks that the job owns
it. The first of two same-named jobs keeps the plain name; the other's TrainingProgress is
`<name>-<kind lowercase>` (`llama-trainjob`), or, if a job already holds that name too,
`<name>-<kind lowercase>-<8 hex digits of its UID>`. Users cannot create TrainingProgress objects
(their roles grant only reading them), so a jobRef is only ever the controller's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from .jobkinds import JobKind, job_kind

T = TypeVar("T", bound=Mapping[str, Any])

MAX_NAME_LENGTH = 253  # a DNS subdomain, what metadata.name of a custom resource must be


def job_ref(tp: Mapping[str, Any]) -> tuple[JobKind, str] | None:
    """(kind, job name) from a TrainingProgress's spec.jobRef, when the kind is one we serve and
    the apiVersion is of its group; None otherwise (never raises: informers index with it)."""
    spec = tp.get("spec")
    ref = spec.get("jobRef") if isinstance(spec, Mapping) else None
    if not isinstance(ref, Mapping):
        return None
    kind = job_kind(str(ref.get("kind", "")))
    name = ref.get("name")
    if kind is None or not isinstance(name, str) or not name:
        return None
    if str(ref.get("apiVersion", "")).rpartition("/")[0] != kind.group:
        return None
    return kind, name


def is_progress_of(tp: Mapping[str, Any], kind: JobKind, name: str) -> bool:
    """Whether `tp`'s jobRef names the job of this kind and name."""
    ref = job_ref(tp)
    return ref is not None and ref[0] is kind and ref[1] == name


def owner_uid(tp: Mapping[str, Any]) -> str | None:
    """The UID of the TrainingProgress's controller (its job), if it has one."""
    for ref in (tp.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def progress_of(tps: Iterable[T], kind: JobKind, name: str, uid: str | None = None) -> list[T]:
    """The TrainingProgress objects of a job among `tps` (one namespace's), its own (controlled by
    `uid`) first when a UID is given, then by name."""
    found = [tp for tp in tps if is_progress_of(tp, kind, name)]
    return sorted(
        found,
        key=lambda tp: (
            uid is not None and owner_uid(tp) != uid,
            str((tp.get("metadata") or {}).get("name", "")),
        ),
    )


def _fit(name: str, suffix: str) -> str:
    if len(name) + len(suffix) <= MAX_NAME_LENGTH:
        return name + suffix
    # Cut at a label boundary-safe character: a DNS label may not end in "-" or ".".
    return name[: MAX_NAME_LENGTH - len(suffix)].rstrip("-.") + suffix


def progress_names(name: str, kind: JobKind, uid: str) -> list[str]:
    """The names a job's new TrainingProgress may take, in order of preference."""
    lower = kind.kind.lower()
    tag = "".join(ch for ch in uid.lower() if ch in "0123456789abcdef")[:8] or "0"
    out: list[str] = []
    for candidate in (name, _fit(name, f"-{lower}"), _fit(name, f"-{lower}-{tag}")):
        if candidate not in out:
            out.append(candidate)
    return out
