"""The job kinds kubeckpt serves, for the webhook, the progress controller and the CLI.

The table itself (`JobKind`, `PYTORCHJOB`, `TRAINJOB`, `JOB_KINDS`, the operators' labels) is
declared once in trainer_runtime.contract.jobkinds: the pod validates KUBECKPT_JOB_KIND against it,
and the runtime image holds trainer_runtime alone. What only the cluster side derives from the
table is here: which job a pod belongs to (its labels name the job; its controller
ownerReference says whether the job's operator created it), and the CEL expression that sends only
those pods to the webhook.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer_runtime.contract.errors import describe
from trainer_runtime.contract.jobkinds import (
    BY_KIND,
    COMPLETION_INDEX_LABEL,
    JOB_KINDS,
    JOBSET_JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    PYTORCHJOB,
    PYTORCHJOB_NAME_LABEL,
    PYTORCHJOB_OPERATOR_LABEL,
    PYTORCHJOB_REPLICA_INDEX_LABEL,
    PYTORCHJOB_REPLICA_TYPE_LABEL,
    PYTORCHJOB_ROLE_LABEL,
    TRAINJOB,
    JobKind,
    job_kind,
)

__all__ = [
    "BY_KIND",
    "COMPLETION_INDEX_LABEL",
    "JOBSET_JOB_INDEX_LABEL",
    "JOBSET_NAME_LABEL",
    "JOBSET_REPLICATED_JOB_LABEL",
    "JOB_KINDS",
    "POD_CONTROLLERS",
    "PYTORCHJOB",
    "PYTORCHJOB_NAME_LABEL",
    "PYTORCHJOB_OPERATOR_LABEL",
    "PYTORCHJOB_REPLICA_INDEX_LABEL",
    "PYTORCHJOB_REPLICA_TYPE_LABEL",
    "PYTORCHJOB_ROLE_LABEL",
    "TRAINJOB",
    "JobIdentity",
    "JobKind",
    "PodController",
    "admission_match_expression",
    "controller_reference",
    "job_identity",
    "job_kind",
    "ownership_problem",
]


@dataclass(frozen=True)
class JobIdentity:
    """Which job a pod belongs to."""

    job_kind: JobKind
    name: str

    @property
    def kind(self) -> str:
        return self.job_kind.kind

    @property
    def target_container(self) -> str:
        return self.job_kind.target_container


def job_identity(labels: Mapping[str, str]) -> JobIdentity | None:
    """The training job a pod belongs to, from the labels its operator set; None if none."""
    for kind in JOB_KINDS:
        if name := kind.job_name(labels):
            return JobIdentity(kind, name)
    return None


@dataclass(frozen=True)
class PodController:
    """The object that creates a job kind's pods, as the pod's controller ownerReference names it
    (what the operators really write: a PyTorchJob's pods are the PyTorchJob's own; a TrainJob's
    are a batch/v1 Job's, which JobSet names `<jobset>-<replicated job>-<index>`)."""

    group: str
    kind: str
    # Whether the owner is the job itself (its name is the job's); else the owner's name starts
    # with `<job name>-`.
    is_the_job: bool


POD_CONTROLLERS: Mapping[str, PodController] = {
    PYTORCHJOB.kind: PodController(PYTORCHJOB.group, PYTORCHJOB.kind, is_the_job=True),
    TRAINJOB.kind: PodController("batch", "Job", is_the_job=False),
}
# The labels the Job controller copies from a batch Job's template onto its pods.
BATCH_JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
BATCH_CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"


def controller_reference(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true` (the API server allows at most one)."""
    refs = metadata.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def _shown(value: object) -> str:
    """A value from the pod (mutating admission runs before the API server validates it) as it
    may appear in a one-line warning."""
    if isinstance(value, str) and value.isprintable() and 0 < len(value) <= 63:
        return value
    return describe(value, 40)


def ownership_problem(job: JobIdentity, metadata: Mapping[str, Any]) -> str | None:
    """Why a pod whose labels name `job` is not one of the pods the job's operator creates, from
    its controller ownerReference and labels; None when they agree.

    Labels alone are not identity: anyone who may create pods in the namespace can label a bare
    pod as a job's. This checks what admission can see without reading other objects: the pod's
    controller is of the kind the job kind's operator creates pods with, and is named
    consistently with the pod's labels (the owner's UID is not looked up; see the README's
    threat model)."""
    want = POD_CONTROLLERS[job.kind]
    ref = controller_reference(metadata)
    what = f"a {job.kind}'s pods are created by " + (
        f"the {want.kind}" if want.is_the_job else f"a {want.group}/{want.kind}"
    )
    if ref is None:
        return f"the pod has no controller ownerReference ({what})"
    api_version, kind, name = ref.get("apiVersion"), ref.get("kind"), ref.get("name")
    group = api_version.rpartition("/")[0] if isinstance(api_version, str) else None
    if kind != want.kind or group != want.group:
        owner = f"{_shown(kind)} {_shown(name)} of {_shown(api_version)}"
        return f"the pod's controller is {owner} ({what})"
    if not isinstance(name, str) or not name:
        return f"the pod's controller {want.kind} has no name"
    owner = f"{want.kind} {_shown(name)}"
    if want.is_the_job:
        return None if name == job.name else f"the pod's controller is {owner}, not {job.name}"
    labels = metadata.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    if not name.startswith(f"{job.name}-"):
        return f"the pod's controller is {owner}, not one of {job.kind} {job.name}"
    if labels.get(BATCH_JOB_NAME_LABEL, name) != name:
        return f"the pod's controller is {owner}, its labels name another Job"
    if labels.get(BATCH_CONTROLLER_UID_LABEL, ref.get("uid")) != ref.get("uid"):
        return f"the pod's controller is {owner}, its labels name another Job's UID"
    return None


def admission_match_expression() -> str:
    """The CEL `matchConditions` expression that lets the API server call the webhook only for
    pods `job_identity` recognises: every other pod of an opted-in namespace is admitted without
    a round trip (and is unaffected when the webhook is slow or down). Kept here, beside
    `job_identity`, so config/webhook's copy is checked against the kinds
    (tests/unit/test_jobkinds.py)."""
    labels = "object.metadata.labels"
    clauses = []
    for kind in JOB_KINDS:
        parts = [f"'{kind.name_label}' in {labels}", f"{labels}['{kind.name_label}'] != ''"]
        parts += [
            f"(!('{key}' in {labels}) || {labels}['{key}'] == '{value}')"
            for key, value in kind.must_match
        ]
        clauses.append("(" + " && ".join(parts) + ")")
    return f"has({labels}) && (" + " || ".join(clauses) + ")"
