"""The job kinds kubeckpt serves, each declared once (stdlib only).

What a job kind is, for every part of kubeckpt: the labels its operator puts on the pods (which
job a pod belongs to, which pod is rank 0), the container that trains, the job's API resource, how
it is suspended, and whether its status has a field we may write. The table is here, in the pod's
contract, because the runtime validates KUBECKPT_JOB_KIND against it and the runtime image holds
trainer_runtime alone; the webhook, the progress controller and the CLI read it through
kubeckpt_api.jobkinds, which adds what they derive from it (which job a pod belongs to, the
webhook's CEL match condition). Each kind declares its checkpoint directory (`storage_dir`).
Adding a kind means one entry here plus its RBAC in config/rbac (tests/unit/test_jobkinds.py
checks the role against this table).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Labels set by the operators (their APIs, not ours).
PYTORCHJOB_NAME_LABEL = "training.kubeflow.org/job-name"
PYTORCHJOB_OPERATOR_LABEL = "training.kubeflow.org/operator-name"
PYTORCHJOB_ROLE_LABEL = "training.kubeflow.org/job-role"
PYTORCHJOB_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
PYTORCHJOB_REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"

LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class JobKind:
    """One kind of training job, as its pods and its API show it."""

    kind: str
    group: str
    version: str
    plural: str
    # The pod label whose value is the job's name (one job of this kind per name and namespace).
    name_label: str
    # Rank 0 is the pod that carries every label of any one of these sets (values compared
    # case-insensitively: the training-operator has written both "Master" and "master").
    rank0: tuple[LabelSet, ...]
    # The container that trains (the webhook's target; else the pod's first container).
    target_container: str
    # Where `true` suspends the job (its operator then deletes the pods, gracefully).
    suspend_field: tuple[str, ...]
    # Whether the job's own status has a field for progress that we may write (TrainJob's
    # status.trainerStatus, where its CRD has it). A PyTorchJob's CRD prunes unknown fields and
    # its operator replaces the whole status.
    progress_status_field: str | None = None
    # Labels that, when present, must have these values: another operator's pods with the same
    # name label (a TFJob's), or a job's pods that do not train (a TrainJob's initializers).
    must_match: tuple[tuple[str, str], ...] = ()
    # Whether the job's checkpoints sit directly under <namespace>/ (see storage_dir). Only the
    # first kind served (PyTorchJob) does, so that its existing checkpoints still resume.
    storage_at_namespace_root: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def storage_dir(self, namespace: str, name: str) -> str:
        """The job's own directory below the policy's storage root (CHECKPOINT_URI, the PVC's
        subPath): `<namespace>/<name>` for a PyTorchJob, `<namespace>/_<kind lowercase>/<name>`
        for every other kind. A job name is a DNS label and never starts with "_", so no job's
        directory is inside or equal to another's, whatever the kinds and names."""
        if self.storage_at_namespace_root:
            return f"{namespace}/{name}"
        return f"{namespace}/_{self.kind.lower()}/{name}"

    def job_name(self, labels: Mapping[str, str]) -> str | None:
        """The job's name if a pod with these labels belongs to a job of this kind."""
        name = labels.get(self.name_label)
        if not name:
            return None
        for key, value in self.must_match:
            if labels.get(key, value) != value:
                return None
        return name

    def is_rank0(self, labels: Mapping[str, str]) -> bool:
        return any(
            all(str(labels.get(k, "")).lower() == v.lower() for k, v in label_set)
            for label_set in self.rank0
        )


PYTORCHJOB = JobKind(
    kind="PyTorchJob",
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    name_label=PYTORCHJOB_NAME_LABEL,
    rank0=(
        ((PYTORCHJOB_ROLE_LABEL, "master"),),
        ((PYTORCHJOB_REPLICA_TYPE_LABEL, "master"), (PYTORCHJOB_REPLICA_INDEX_LABEL, "0")),
    ),
    target_container="pytorch",
    suspend_field=("spec", "runPolicy", "suspend"),
    must_match=((PYTORCHJOB_OPERATOR_LABEL, "pytorchjob-controller"),),
    storage_at_namespace_root=True,
)

TRAINJOB = JobKind(
    kind="TrainJob",
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainjobs",
    # Trainer names the JobSet after the TrainJob.
    name_label=JOBSET_NAME_LABEL,
    rank0=(((JOBSET_JOB_INDEX_LABEL, "0"), (COMPLETION_INDEX_LABEL, "0")),),
    target_container="node",
    suspend_field=("spec", "suspend"),
    progress_status_field="trainerStatus",
    # The trainer step's replicated job; "dataset-initializer" and "model-initializer" pods only
    # download, and get nothing injected.
    must_match=((JOBSET_REPLICATED_JOB_LABEL, "node"),),
)

# In the order a pod is matched: a PyTorchJob's labels first.
JOB_KINDS: tuple[JobKind, ...] = (PYTORCHJOB, TRAINJOB)
BY_KIND: Mapping[str, JobKind] = {k.kind: k for k in JOB_KINDS}


def job_kind(kind: str) -> JobKind | None:
    return BY_KIND.get(kind)
