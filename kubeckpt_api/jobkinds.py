"""The job kinds kubeckpt serves, for the webhook, the progress controller and the CLI.

The table itself (`JobKind`, `PYTORCHJOB`, `TRAINJOB`, `JOB_KINDS`, the operators' labels) is
declared once in trainer_runtime.contract.jobkinds: the pod validates KUBECKPT_JOB_KIND against it,
and the runtime image holds trainer_runtime alone. What only the cluster side derives from the
table is here: which job a pod belongs to, and the CEL expression that sends only those pods to
the webhook.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
    "PYTORCHJOB",
    "PYTORCHJOB_NAME_LABEL",
    "PYTORCHJOB_OPERATOR_LABEL",
    "PYTORCHJOB_REPLICA_INDEX_LABEL",
    "PYTORCHJOB_REPLICA_TYPE_LABEL",
    "PYTORCHJOB_ROLE_LABEL",
    "TRAINJOB",
    "JobIdentity",
    "JobKind",
    "admission_match_expression",
    "job_identity",
    "job_kind",
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
