"""TrainJobs on the real node (Kubeflow Trainer v2's torch-distributed runtime, run by JobSet): the
TrainJob as a user writes it, and reading its pods, logs, TrainingProgress and Events back. Shared
by the TrainJob node tests (tests/node/test_trainjob_on_node.py)."""

from __future__ import annotations

import json
import re

from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.kubeflow_trainer import RUNTIME
from localcluster.pods import pod_problem, running


def trainjob(name: str, ns: str, command: str, *, nodes: int, env: list[dict] = ()) -> dict:
    """A TrainJob on Trainer's torch-distributed runtime, nothing of kubeckpt in it. The
    runtimePatches mount the scripts and place the pods on the test session's tainted node."""
    pod_spec = kubeckpt_addon.real_node_placement(
        {
            "volumes": [{"name": "scripts", "configMap": {"name": "train"}}],
            "containers": [
                {"name": "node", "volumeMounts": [{"name": "scripts", "mountPath": "/scripts"}]}
            ],
        }
    )
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {
                "numNodes": nodes,
                "command": [
                    "bash",
                    "-c",
                    f"cd /tmp && {command}; rc=$?; echo exited $rc; exit $rc",
                ],
                "env": [
                    {"name": "PYTHONPATH", "value": "/scripts"},
                    {
                        "name": "HF_TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
                    },
                    *env,
                ],
                "resourcesPerNode": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            },
            "runtimePatches": [
                {
                    "manager": "kubeckpt.io/tests",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {"spec": {"template": {"spec": pod_spec}}},
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def torch_command(steps: int, step_seconds: float) -> str:
    return f"torchrun /scripts/train.py --steps={steps} --step-seconds={step_seconds}"


def get(cluster: LocalCluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def pods(cluster: LocalCluster, ns: str, job: str) -> list[dict]:
    sel = f"jobset.sigs.k8s.io/jobset-name={job}"
    return get(cluster, "pods", "-n", ns, "-l", sel)["items"]


def rank_pod(cluster: LocalCluster, ns: str, job: str, rank: int = 0) -> dict | None:
    """The live (not terminating) pod of this rank, if any."""
    for p in pods(cluster, ns, job):
        labels = p["metadata"]["labels"]
        if labels.get("batch.kubernetes.io/job-completion-index") == str(rank) and not p[
            "metadata"
        ].get("deletionTimestamp"):
            return p
    return None


def wait_rank(cluster: LocalCluster, ns: str, job: str, rank: int, timeout: float) -> dict:
    """The rank's live pod once its containers run; fails early with what the kubelet reports."""

    def ready() -> dict | None:
        pod = rank_pod(cluster, ns, job, rank)
        if pod is None:
            return None
        if problem := pod_problem(pod):
            raise AssertionError(problem)
        return pod if running(pod) else None

    try:
        return wait_for(ready, f"{job}'s rank {rank} running", timeout)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{job_logs(cluster, ns, job)[-3000:]}") from e


def tp_status(cluster: LocalCluster, ns: str, job: str) -> dict:
    p = cluster.kubectl("get", "tp", job, "-n", ns, "-o", "json", check=False)
    return (json.loads(p.stdout).get("status") or {}) if p.returncode == 0 else {}


def trainjob_obj(cluster: LocalCluster, ns: str, job: str) -> dict:
    return json.loads(
        cluster.kubectl(
            "get", "trainjob", job, "-n", ns, "-o", "json", "--show-managed-fields"
        ).stdout
    )


def complete(cluster: LocalCluster, ns: str, job: str) -> bool:
    conds = (trainjob_obj(cluster, ns, job).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)


def job_logs(cluster: LocalCluster, ns: str, job: str) -> str:
    sel = f"jobset.sigs.k8s.io/jobset-name={job}"
    out = cluster.kubectl("logs", "-n", ns, "-l", sel, "-c", "node", "--tail=-1", check=False)
    return out.stdout


def events(cluster: LocalCluster, ns: str, job: str) -> list[str]:
    out = get(
        cluster,
        "events",
        "-n",
        ns,
        "--field-selector",
        f"involvedObject.name={job},involvedObject.kind=TrainJob",
    )
    return [e["reason"] for e in out["items"] for _ in range(e.get("count") or 1)]


def sha256_of(text: str) -> str | None:
    m = re.search(r"final parameters sha256 ([0-9a-f]{64})", text) or re.search(
        r'"sha256": "([0-9a-f]{64})"', text
    )
    return m.group(1) if m else None
