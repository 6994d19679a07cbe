"""TrainJobs on the local control plane without Kubeflow Trainer: a CRD of our own (so that the
API can come and go while the controller runs) and pods owned as Trainer and JobSet own them
(pod -> batch Job -> JobSet -> TrainJob; progress_support.trainjob_batch_job)."""

from __future__ import annotations

import json
from pathlib import Path

from progress_support import (
    KWOK_KEEPS_RUNNING,
    controller_ref,
    install_jobset_crd,
    trainjob_batch_job,
    write_atomic,
)

from localcluster import LocalCluster

TRAINJOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
    "spec": {
        "group": "trainer.kubeflow.org",
        "scope": "Namespaced",
        "names": {
            "kind": "TrainJob",
            "plural": "trainjobs",
            "singular": "trainjob",
            "listKind": "TrainJobList",
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "trainerStatus": {
                                        "type": "object",
                                        "properties": {
                                            "progressPercentage": {
                                                "type": "integer",
                                                "format": "int32",
                                                "minimum": 0,
                                                "maximum": 100,
                                            },
                                            "estimatedRemainingSeconds": {
                                                "type": "integer",
                                                "format": "int32",
                                                "minimum": 0,
                                            },
                                            "metrics": {
                                                "type": "array",
                                                "x-kubernetes-list-type": "atomic",
                                                "items": {
                                                    "type": "object",
                                                    "required": ["name", "value"],
                                                    "properties": {
                                                        "name": {"type": "string", "minLength": 1},
                                                        "value": {"type": "string", "minLength": 1},
                                                    },
                                                },
                                            },
                                            "lastUpdatedTime": {
                                                "type": "string",
                                                "format": "date-time",
                                            },
                                        },
                                    }
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def stop_trainer(cluster: LocalCluster) -> None:
    """These tests install a TrainJob CRD of their own, and the first one needs none installed:
    Kubeflow Trainer (started by the real-node tests) goes, with its CRD."""
    if cluster.trainer.started:  # its TrainJobs' finalizers need Trainer to go
        cluster.kubectl(
            "delete", "trainjobs", "-A", "--all", "--timeout=60s", check=False, timeout=90
        )
    cluster.stop_trainer()
    cluster.kubectl(
        "delete",
        "crd",
        "trainjobs.trainer.kubeflow.org",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
        check=False,
        timeout=90,
    )


def trainjob_with_pod(
    cluster: LocalCluster, ns: str, name: str, first: bytes, env: tuple[dict, ...] = ()
) -> Path:
    """A TrainJob, its JobSet and batch Job, and the Job's rank-0 pod serving `first` as its
    progress file (returned)."""
    cluster.apply(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {},
        }
    )
    owner = trainjob_batch_job(cluster, ns, name)
    return trainjob_pod(cluster, ns, name, f"{name}-node-0-0", first, [controller_ref(owner)], env)


def trainjob_pod(
    cluster: LocalCluster,
    ns: str,
    name: str,
    pod: str,
    first: bytes,
    owners: list[dict],
    env: tuple[dict, ...] = (),
    *,
    finalizers: tuple[str, ...] = (),
    scheduling_gates: tuple[str, ...] = (),
) -> Path:
    """A pod with the labels of TrainJob `name`'s injected rank-0 pod and these ownerReferences,
    serving `first` as its progress file (returned). `finalizers` keep it, once deleted, in the
    API as a pod being deleted (KWOK deletes a deleted pod at once); `scheduling_gates` keep it
    Pending until they are removed."""
    d = cluster.exec_dir(ns, pod)
    write_atomic(d / "progress.json", first)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": ns,
                "ownerReferences": owners,
                "finalizers": list(finalizers),
                "annotations": KWOK_KEEPS_RUNNING,
                "labels": {
                    "kubeckpt.io/injected": "true",
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/job-index": "0",
                    "batch.kubernetes.io/job-completion-index": "0",
                },
            },
            "spec": {
                "schedulingGates": [{"name": g} for g in scheduling_gates],
                "containers": [
                    {
                        "name": "node",
                        "image": "busybox",
                        "env": [
                            {"name": "TRAINING_PROGRESS_FILE", "value": str(d / "progress.json")},
                            *env,
                        ],
                    }
                ],
            },
        }
    )
    return d / "progress.json"


def trainjob(cluster: LocalCluster, ns: str, name: str) -> dict:
    out = cluster.kubectl(
        "get", "trainjob", name, "-n", ns, "-o", "json", "--show-managed-fields"
    ).stdout
    return json.loads(out)


def install_crd(cluster: LocalCluster) -> None:
    # A previous test's CRD may still be terminating: applying over it would not bring it back.
    cluster.kubectl(
        "wait", "--for=delete", "crd/trainjobs.trainer.kubeflow.org", "--timeout=60s", check=False
    )
    cluster.apply(TRAINJOB_CRD)
    cluster.kubectl("wait", "--for=condition=Established", "crd/trainjobs.trainer.kubeflow.org")
    install_jobset_crd(cluster)
