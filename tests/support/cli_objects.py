"""Objects the `kubeckpt` CLI's tests read: TrainingProgress objects and status as the controller
writes them, and training pods injected by the webhook's own mutation function."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.operator_pods import pytorchjob_owner
from webhook.mutation import mutate

REPO = Path(__file__).resolve().parents[2]
NOW = "2026-03-01T12:00:00Z"


def condition(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message or reason,
        "lastTransitionTime": NOW,
    }


def tp(
    name: str,
    namespace: str,
    *,
    kind: str = "PyTorchJob",
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    api = "kubeflow.org/v1" if kind == "PyTorchJob" else "trainer.kubeflow.org/v1alpha1"
    obj: dict[str, Any] = {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "TrainingProgress",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"jobRef": {"apiVersion": api, "kind": kind, "name": name}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def training_status(step: int, total: int = 100, **extra: Any) -> dict[str, Any]:
    """A status as the controller applies it for a job that trains."""
    status: dict[str, Any] = {
        "step": step,
        "totalSteps": total,
        "epoch": 1,
        "loss": f"{1.0 / (step + 1):.4f}",
        "percentComplete": f"{100.0 * step / total:.1f}",
        "estimatedTimeRemaining": "5m",
        "stepSeconds": "0.50",
        "lastUpdateTime": NOW,
        "source": "exec",
        "observedPod": "",
        "checkpointing": {
            "enabled": True,
            "latestCheckpoint": f"/mnt/kubeckpt/ns/job/checkpoint-{step - step % 10}",
            "latestCheckpointTime": NOW,
            "latestCheckpointReason": "periodic",
            "checkpointsCreated": 2,
        },
        "conditions": [condition("Progressing", "True", "StepAdvanced")],
    }
    status.update(extra)
    return status


POLICY = {
    "apiVersion": "kubeckpt.io/v1alpha1",
    "kind": "CheckpointPolicy",
    "metadata": {"name": "team-default", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"storage": {"uri": "pvc://ckpt/runs"}, "jit": {"maxGracePeriodSeconds": 240}},
}


def injected_pod(
    job: str,
    namespace: str,
    role: str = "master",
    index: int = 0,
    *,
    storage: str = "pvc://ckpt/runs",
    secret: str | None = None,
) -> dict[str, Any]:
    """A PyTorchJob pod as the training-operator creates it, mutated as the webhook does (the
    storage `file://...` for pods that must start on KWOK nodes: no claim to bind; `secret`:
    the policy's storage.secretRef)."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{role}-{index}",
            "namespace": namespace,
            "labels": {
                "training.kubeflow.org/job-name": job,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": role,
                "training.kubeflow.org/replica-index": str(index),
                **({"training.kubeflow.org/job-role": "master"} if role == "master" else {}),
            },
            "annotations": {"kubeckpt.io/interval": "10m"},
        },
        "spec": {
            "containers": [{"name": "pytorch", "image": "trainer:1", "command": ["sleep", "1"]}]
        },
    }
    ns = {"metadata": {"name": namespace, "labels": {"kubeckpt.io/inject": "enabled"}}}
    policy = copy.deepcopy(POLICY)
    policy["metadata"]["namespace"] = namespace
    policy["spec"]["storage"]["uri"] = storage
    if secret is not None:
        policy["spec"]["storage"]["secretRef"] = {"name": secret}
    # The webhook injects only a pod its job controls: mutated with the operator's controller
    # reference, returned without it, since these tests create the pod without its PyTorchJob
    # (the garbage collector deletes a pod whose owner does not exist).
    pod["metadata"]["ownerReferences"] = [pytorchjob_owner(job)]
    result = mutate(pod, policy, ns)
    assert result.injected, result.reason
    del result.pod["metadata"]["ownerReferences"]
    return result.pod


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`kubeckpt ARGS` as a user runs it: a separate process, this checkout first on the path."""
    full_env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'hack'}"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kubeckpt_cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )
