"""Smoke tests of the local control plane: real API server, controllers, scheduler, KWOK, the
training-operator, our CRDs, authentication and RBAC."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from localcluster import LocalCluster, sweep_stale_workdirs, wait_for

REPO = Path(__file__).resolve().parents[2]
JOB = yaml.safe_load((REPO / "hack" / "manifests" / "pytorchjob-mnist.yaml").read_text())


def _pods(cluster: LocalCluster, ns: str, selector: str) -> list[dict]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout
    return json.loads(out)["items"]


def test_pytorchjob_pods_run_on_kwok_and_exec_returns_exact_bytes(
    cluster: LocalCluster, namespace: str
) -> None:
    job = {**JOB, "metadata": {"name": "mnist", "namespace": namespace}}
    cluster.apply(job)
    selector = "training.kubeflow.org/job-name=mnist"

    def running() -> list[dict] | None:
        pods = _pods(cluster, namespace, selector)
        ok = len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)
        return pods if ok else None

    pods = wait_for(running, "the training-operator's two pods to run on KWOK", timeout=60)
    roles = sorted(p["metadata"]["labels"]["training.kubeflow.org/replica-type"] for p in pods)
    assert roles == ["master", "worker"]
    for p in pods:
        assert p["spec"]["nodeName"].startswith("kwok-node-"), "bound by the real scheduler"
        owner = p["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("PyTorchJob", "mnist")

    master = next(p for p in pods if p["metadata"]["labels"].get("training.kubeflow.org/job-role"))
    assert master["metadata"]["name"] == "mnist-master-0"
    workdir = cluster.exec_dir(namespace, "mnist-master-0")
    payload = bytes(range(256)) * 4096 + b"\x00tail\n"  # every byte value, 1 MiB and a bit
    (workdir / "blob.bin").write_bytes(payload)

    def exec_cat() -> bytes | None:
        proc = cluster.kubectl(
            "exec",
            "-n",
            namespace,
            "mnist-master-0",
            "-c",
            "pytorch",
            "--",
            "cat",
            "blob.bin",
            check=False,
            text=False,
        )
        return proc.stdout if proc.returncode == 0 else None

    # The Exec object reaches KWOK through its informer: allow it a moment.
    got = wait_for(exec_cat, "kubectl exec through the API server to KWOK", timeout=30)
    assert got == payload

    # The job's status is the operator's: it reports the job running.
    def job_running() -> bool:
        obj = json.loads(
            cluster.kubectl("get", "pytorchjob", "mnist", "-n", namespace, "-o", "json").stdout
        )
        conds = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
        return conds.get("Running") == "True"

    wait_for(job_running, "the PyTorchJob's Running condition", timeout=30)


def test_exec_exit_status_and_stderr_pass_through(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply({**JOB, "metadata": {"name": "codes", "namespace": namespace}})
    wait_for(
        lambda: any(
            p["status"].get("phase") == "Running"
            for p in _pods(cluster, namespace, "training.kubeflow.org/job-name=codes")
            if p["metadata"]["name"] == "codes-master-0"
        ),
        "the master pod to run",
        timeout=60,
    )
    cluster.exec_dir(namespace, "codes-master-0")

    def exec_sh(script: str) -> subprocess.CompletedProcess:
        return cluster.kubectl(
            "exec", "-n", namespace, "codes-master-0", "--", "sh", "-c", script, check=False
        )

    proc = wait_for(
        lambda: (p := exec_sh("echo out; echo err >&2")).returncode == 0 and p,
        "an exec into the master pod",
        timeout=30,
    )
    assert proc.stdout == "out\n", "stdout carries only stdout"
    # kubectl itself may add lines to stderr (seen under load: "Unknown stream id 1").
    assert "err" in proc.stderr.splitlines(), "stderr arrives on its own stream"
    # KWOK reports a failed command as an InternalError that names the exit status (a real kubelet
    # sends NonZeroExitCode with the code as a cause); either way the exec fails visibly.
    proc = exec_sh("exit 7")
    assert proc.returncode != 0
    assert "exit status 7" in proc.stderr


def test_training_operator_webhook_rejects_invalid_job(
    cluster: LocalCluster, namespace: str
) -> None:
    bad = json.loads(json.dumps(JOB))
    bad["metadata"] = {"name": "bad", "namespace": namespace}
    # PyTorchJob validation requires a container named "pytorch".
    for spec in bad["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["name"] = "trainer"
    proc = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert proc.returncode != 0
    assert "pytorch" in proc.stderr and "denied the request" in proc.stderr


POLICY = {
    "apiVersion": "kubeckpt.io/v1alpha1",
    "kind": "CheckpointPolicy",
    "metadata": {"name": "default"},
    "spec": {"storage": {"uri": "pvc://ckpt-claim/runs"}},
}


def _policy(namespace: str, name: str, **spec: object) -> dict:
    return {
        **POLICY,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**POLICY["spec"], **spec},  # type: ignore[dict-item]
    }


def test_checkpointpolicy_accepted_with_defaults(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply(_policy(namespace, "ok"), server_side=False)
    obj = json.loads(cluster.kubectl("get", "ckptpol", "ok", "-n", namespace, "-o", "json").stdout)
    spec = obj["spec"]
    assert spec["interval"] == "5m"
    assert spec["strategy"] == "time"
    assert spec["maxCheckpoints"] == 3
    assert spec["resume"] is True
    assert spec["jit"] == {"enabled": True, "maxGracePeriodSeconds": 300}
    assert spec["storage"]["mountPath"] == "/mnt/kubeckpt"
    assert spec["progress"]["updateEverySteps"] == 5
    table = cluster.kubectl("get", "ckptpol", "-n", namespace).stdout
    assert "pvc://ckpt-claim/runs" in table


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"maxCheckpoints": -1}, "maxCheckpoints"),
        ({"strategy": "sometimes"}, "strategy"),
        ({"strategy": "steps"}, "saveSteps"),
        ({"storage": {"uri": "ftp://host/x"}}, "storage.uri"),
        ({"interval": "five minutes"}, "interval"),
    ],
)
def test_invalid_checkpointpolicy_rejected(
    cluster: LocalCluster, namespace: str, spec: dict, field: str
) -> None:
    proc = cluster.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump(_policy(namespace, "bad", **spec)), check=False
    )
    assert proc.returncode != 0, proc.stdout
    assert "is invalid" in proc.stderr
    assert field in proc.stderr


def test_trainingprogress_status_subresource_and_columns(
    cluster: LocalCluster, namespace: str
) -> None:
    tp = {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "TrainingProgress",
        "metadata": {"name": "job-a", "namespace": namespace},
        "spec": {
            "jobRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "job-a"}
        },
        # A status in the main resource is dropped: it is written only through /status.
        "status": {"step": 99},
    }
    cluster.apply(tp)
    obj = json.loads(cluster.kubectl("get", "tp", "job-a", "-n", namespace, "-o", "json").stdout)
    assert "step" not in obj.get("status", {})
    status = {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "TrainingProgress",
        "metadata": {"name": "job-a", "namespace": namespace},
        "status": {
            "state": "Training",
            "step": 150,
            "percentComplete": "50.0",
            "loss": "0.4523",
            "estimatedTimeRemaining": "45m",
            "checkpointing": {"latestCheckpointTime": "2024-01-15T10:25:00Z"},
        },
    }
    cluster.kubectl(
        "apply",
        "--server-side",
        "--field-manager=kubeckpt",
        "--subresource=status",
        "-f",
        "-",
        input=yaml.safe_dump(status),
    )
    header, row = cluster.kubectl("get", "tp", "job-a", "-n", namespace).stdout.splitlines()
    assert header.split() == [
        "NAME",
        "JOB",
        "STATE",
        "STEP",
        "PERCENT",
        "LOSS",
        "ETA",
        "LAST-CHECKPOINT",
        "AGE",
    ]
    assert row.split()[:7] == ["job-a", "job-a", "Training", "150", "50.0", "0.4523", "45m"]


def test_garbage_collector_removes_owned_trainingprogress(
    cluster: LocalCluster, namespace: str
) -> None:
    cm = json.loads(
        cluster.kubectl("create", "configmap", "owner", "-n", namespace, "-o", "json").stdout
    )
    cluster.apply(
        {
            "apiVersion": "kubeckpt.io/v1alpha1",
            "kind": "TrainingProgress",
            "metadata": {
                "name": "owned",
                "namespace": namespace,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "owner",
                        "uid": cm["metadata"]["uid"],
                    }
                ],
            },
            "spec": {"jobRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner"}},
        }
    )
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: cluster.kubectl("get", "tp", "owned", "-n", namespace, check=False).returncode != 0,
        "the garbage collector to delete the owned TrainingProgress",
        timeout=60,
    )


def _bearer_get(cluster: LocalCluster, path: str, token: str) -> int:
    assert cluster.workdir is not None
    ctx = ssl.create_default_context(cafile=str(cluster.workdir / "pki" / "ca.crt"))
    req = urllib.request.Request(
        cluster.server + path, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_service_account_tokens_and_rbac(cluster: LocalCluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    token = cluster.kubectl("create", "token", "reader", "-n", namespace).stdout.strip()
    path = f"/api/v1/namespaces/{namespace}/pods"
    assert _bearer_get(cluster, path, "not-a-token") == 401
    assert _bearer_get(cluster, path, token) == 403, "RBAC denies what no role grants"
    cluster.kubectl(
        "create", "role", "pod-reader", "--verb=list", "--resource=pods", "-n", namespace
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "pod-reader",
        "--role=pod-reader",
        f"--serviceaccount={namespace}:reader",
        "-n",
        namespace,
    )
    wait_for(
        lambda: _bearer_get(cluster, path, token) == 200,
        "the RoleBinding to take effect",
        timeout=10,
    )
    assert _bearer_get(cluster, "/api/v1/secrets", token) == 403


def test_namespace_deletion_completes(cluster: LocalCluster) -> None:
    cluster.kubectl("create", "namespace", "doomed")
    cluster.kubectl("create", "configmap", "x", "-n", "doomed")
    cluster.kubectl("delete", "namespace", "doomed", "--timeout=60s")
    assert cluster.kubectl("get", "namespace", "doomed", check=False).returncode != 0


CHILD = """
import json, sys, time
sys.path.insert(0, {hack!r})
from localcluster import LocalCluster
c = LocalCluster(nodes=1)
c.start()
print(json.dumps(c.describe()), flush=True)
time.sleep(600)
"""


def test_sigkilled_owner_leaves_no_processes(cluster: LocalCluster) -> None:
    env = {**os.environ, "KUBECKPT_BINARIES_ENV": os.environ.get("KUBECKPT_BINARIES_ENV", "")}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(hack=str(REPO / "hack"))],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, "the child cluster did not start"
        info = json.loads(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    pids = list(info["pids"].values())
    assert len(pids) >= 6
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)
    alive = [
        p
        for p in pids
        if Path(f"/proc/{p}").exists() and "zombie" not in Path(f"/proc/{p}/status").read_text()
    ]
    assert alive == [], f"processes outlived their SIGKILLed owner: {alive}"
    workdir = Path(info["workdir"])
    assert workdir.exists()
    assert workdir in sweep_stale_workdirs(workdir.parent)
    assert not workdir.exists()
