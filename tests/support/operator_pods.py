"""Pods as the operators create them: the labels and the controller ownerReference that the
training-operator puts on a PyTorchJob's pods and the Job controller on a TrainJob's (JobSet's
batch Jobs'), as seen on the local cluster's real controllers. The webhook injects only pods whose
controller agrees with their labels (kubeckpt_api.jobkinds.ownership_problem)."""

from __future__ import annotations

import uuid
from typing import Any


def pytorchjob_owner(job: str, uid: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": job,
        "uid": uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"pytorchjob/{job}")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def batch_job_owner(jobset: str, replicated_job: str = "node", index: int = 0) -> dict[str, Any]:
    """The batch Job JobSet creates for one replicated job (`<jobset>-<rjob>-<index>`)."""
    name = f"{jobset}-{replicated_job}-{index}"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"job/{name}")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pytorchjob_pod_metadata(job: str, namespace: str, role: str = "master") -> dict[str, Any]:
    labels = {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": role,
        "training.kubeflow.org/replica-index": "0",
    }
    if role == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    return {
        "name": f"{job}-{role}-0",
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [pytorchjob_owner(job)],
    }


def trainjob_pod_metadata(jobset: str, namespace: str, index: int = 0) -> dict[str, Any]:
    owner = batch_job_owner(jobset)
    return {
        "name": f"{owner['name']}-{index}-x",
        "namespace": namespace,
        "labels": {
            "jobset.sigs.k8s.io/jobset-name": jobset,
            "jobset.sigs.k8s.io/replicatedjob-name": "node",
            "jobset.sigs.k8s.io/job-index": "0",
            "batch.kubernetes.io/job-completion-index": str(index),
            "batch.kubernetes.io/job-name": owner["name"],
            "batch.kubernetes.io/controller-uid": owner["uid"],
        },
        "ownerReferences": [owner],
    }


def operator_pod(kind: str, job: str, namespace: str, container: str | None = None) -> dict:
    """A minimal training pod of a PyTorchJob (`kind` "PyTorchJob") or TrainJob (else)."""
    if kind == "PyTorchJob":
        meta, name = pytorchjob_pod_metadata(job, namespace), container or "pytorch"
    else:
        meta, name = trainjob_pod_metadata(job, namespace), container or "node"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": name, "image": "trainer:1"}]},
    }


def training_progress(
    name: str,
    namespace: str,
    kind: str,
    job: str,
    owner_uid: str | None,
    status: dict | None = None,
) -> dict[str, Any]:
    """A TrainingProgress as the controller keeps it: about `kind` `job` (spec.jobRef), owned by
    the job with UID `owner_uid` (None: no owner), named `name` (the job's name, or
    `<job>-<kind>` for the second of two same-named jobs of different kinds)."""
    api_version = "kubeflow.org/v1" if kind == "PyTorchJob" else "trainer.kubeflow.org/v1alpha1"
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": job,
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "TrainingProgress",
        "metadata": metadata,
        "spec": {"jobRef": {"apiVersion": api_version, "kind": kind, "name": job}},
        "status": status or {},
    }
