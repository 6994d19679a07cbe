"""`kubeckpt checkpoints JOB` for a job with no running rank-0 pod, against the local control
plane: the lister pod the CLI creates (what it may do, what it mounts, its deadline), its
deletion when the listing fails, leftovers of an earlier run, and the errors when no lister pod
can help. KWOK runs no containers (the pod never ends here): the listing itself, after a job
succeeded and after it was deleted, is tests/node/test_cli_on_node.py's."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kubeckpt_cli.lister_pod import JOB_LABEL, LISTER_LABEL
from localcluster import LocalCluster, wait_for
from tests.support.cli_objects import POLICY, REPO, run_cli, tp, training_status
from tests.support.node_pods import load_demo
from trainer_runtime.contract import build_manifest
from trainer_runtime.storage import LocalTier

pytestmark = pytest.mark.timeout(300)

STORAGE_HINT = "; or pass --storage PATH with the storage mounted here\n"
LISTER_HINT = (
    ": listing without a running pod creates a short-lived pod in the namespace (it needs create, "
    f"get, list and delete on pods and get on pods/log){STORAGE_HINT}"
)


def kubeckpt(cluster: LocalCluster, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run_cli("--kubeconfig", str(cluster.kubeconfig), *args, **kw)


def apply_policy(cluster: LocalCluster, ns: str, name: str, uri: str) -> None:
    policy = copy.deepcopy(POLICY)
    policy["metadata"] = {"name": name, "namespace": ns}
    policy["spec"]["storage"]["uri"] = uri
    cluster.apply(policy)


def finished_job(cluster: LocalCluster, ns: str, job: str) -> None:
    """A TrainingProgress as a succeeded job leaves it: its pod gone, its latest checkpoint."""
    cluster.apply(tp(job, ns))
    status = training_status(100, observedPod=f"{job}-master-0")
    status["checkpointing"]["latestCheckpoint"] = f"/mnt/kubeckpt/{ns}/{job}/checkpoint-100"
    cluster.kubectl(
        "patch", "tp", job, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def lister_pods(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"{LISTER_LABEL}=true", "-o", "json")
    return {p["metadata"]["name"]: p for p in json.loads(out.stdout)["items"]}


def unschedulable_lister(cluster: LocalCluster, ns: str, name: str, phase: str | None) -> None:
    """A lister pod as another run of the CLI left it (or has it in flight)."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {LISTER_LABEL: "true"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "no-such-node"},
                "containers": [{"name": "list", "image": "x"}],
            },
        }
    )
    if phase:
        cluster.kubectl(
            "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": phase}}),
        )  # fmt: skip


def start_cli(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'hack'}"}
    return subprocess.Popen(
        [sys.executable, "-m", "kubeckpt_cli", "--kubeconfig", str(cluster.kubeconfig), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_the_lister_pod_for_a_finished_job(cluster: LocalCluster, namespace: str) -> None:
    apply_policy(cluster, namespace, "team-default", "pvc://ckpt/runs")
    finished_job(cluster, namespace, "llama")
    unschedulable_lister(cluster, namespace, "kubeckpt-ls-old", "Failed")  # left behind
    unschedulable_lister(cluster, namespace, "kubeckpt-ls-inflight", None)  # someone's, now

    proc = start_cli(
        cluster, "checkpoints", "llama", "-n", namespace, "--timeout", "8", "--image", "lister:1"
    )
    created: dict[str, Any] = {}

    def appears() -> bool:
        for pod in lister_pods(cluster, namespace).values():
            if pod["metadata"]["labels"].get(JOB_LABEL) == "llama":
                created.update(pod)
        return bool(created)

    try:
        wait_for(appears, "the lister pod", timeout=30)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    name = created["metadata"]["name"]
    assert name.startswith("kubeckpt-ls-llama-")

    # What it may do: read the job's own directory, as the training pod had it, and no more
    spec = created["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 8
    assert spec["securityContext"]["runAsNonRoot"] is True
    (c,) = spec["containers"]
    assert c["image"] == "lister:1"
    assert c["command"][:5] == [
        "python3", "-m", "trainer_runtime.listing",
        "--persistent", f"/mnt/kubeckpt/{namespace}/llama",
    ]  # fmt: skip
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["limits"]["memory"] == "256Mi"
    (mount,) = c["volumeMounts"]
    assert mount["subPath"] == f"runs/{namespace}/llama" and mount["readOnly"] is True
    (volume,) = spec["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "ckpt", "readOnly": True}

    # KWOK never runs it (and the claim does not exist): bounded by --timeout, then deleted
    assert proc.returncode == 1, err
    lines = err.splitlines()
    assert lines[0] == (
        f'kubeckpt: cannot list the checkpoints of "llama": its pod llama-master-0 is gone: '
        f"listing through lister pod {name} (lister:1)"
    )
    assert lines[1].startswith(f"kubeckpt: lister pod {name} did not finish in 8s (")
    assert err.endswith(STORAGE_HINT) and len(lines) == 2 and out == ""

    def cleaned() -> bool:
        return set(lister_pods(cluster, namespace)) == {"kubeckpt-ls-inflight"}

    wait_for(cleaned, "the lister pod and the leftover to be deleted", timeout=30)


def test_when_no_lister_pod_can_help(cluster: LocalCluster, namespace: str, tmp_path: Path) -> None:
    # A deleted job: its TrainingProgress went with it; without --kind, say what to give
    gone = kubeckpt(cluster, "checkpoints", "gone", "-n", namespace)
    assert gone.returncode == 3
    assert gone.stderr.endswith(
        "for a deleted job, name its --kind (a lister pod then mounts the storage), or pass "
        "--storage PATH with the storage mounted here\n"
    )
    # With --kind, but no policy says where its storage is
    kind = kubeckpt(cluster, "checkpoints", "gone", "-n", namespace, "--kind", "PyTorchJob")
    assert kind.returncode == 3
    assert kind.stderr == (
        'kubeckpt: cannot list the checkpoints of "gone": it has no TrainingProgress, and no '
        f'lister pod can mount its storage: no usable CheckpointPolicy in namespace "{namespace}" '
        "says where; pass --storage PATH with the storage mounted here\n"
    )
    # An object store: not listed without a running pod (yet)
    apply_policy(cluster, namespace, "s3", "s3://bucket/runs")
    finished_job(cluster, namespace, "bert")
    s3 = kubeckpt(cluster, "checkpoints", "bert", "-n", namespace)
    assert s3.returncode == 3
    assert (
        'CheckpointPolicy "s3" has s3://bucket/runs: an s3:// storage is not listed without a '
        "running pod yet; pass --storage PATH" in s3.stderr
    )
    assert f"the latest checkpoint recorded is /mnt/kubeckpt/{namespace}/bert/checkpoint-100" in (
        s3.stderr
    )
    assert lister_pods(cluster, namespace) == {}

    # A user who may read but not create pods: the lister's rights, named
    cluster.kubectl("delete", "checkpointpolicy", "s3", "-n", namespace)
    apply_policy(cluster, namespace, "pvc", "pvc://ckpt/runs")
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    kc = cluster.token_kubeconfig(tmp_path / "reader", "reader", namespace)
    for resource in ("trainingprogresses.kubeckpt.io", "checkpointpolicies.kubeckpt.io", "pods"):
        role = resource.split(".")[0]
        cluster.kubectl(
            "create", "role", role, "-n", namespace, "--verb=get,list", f"--resource={resource}"
        )
        cluster.kubectl(
            "create", "rolebinding", role, "-n", namespace, f"--role={role}",
            f"--serviceaccount={namespace}:reader",
        )  # fmt: skip

    def denied() -> subprocess.CompletedProcess[str]:
        return run_cli("--kubeconfig", str(kc), "checkpoints", "bert", "-n", namespace)

    wait_for(lambda: "cannot create pods" in denied().stderr, "the RoleBindings", timeout=30)
    proc = denied()
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[1].startswith(
        f'kubeckpt: forbidden: you cannot create pods in namespace "{namespace}"'
    )
    assert proc.stderr.endswith(LISTER_HINT)
    assert lister_pods(cluster, namespace) == {}


def test_the_lister_pods_log_is_the_table(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """The CLI's side of a listing that ends: KWOK runs the pod (its claim bound), this test ends
    it as the kubelet would and serves its log (KWOK's Logs: the listing's real output)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    cluster.apply(load_demo().storage_objects(volume, namespace))
    apply_policy(cluster, namespace, "team-default", "pvc://checkpoints/runs")
    finished_job(cluster, namespace, "llama")
    job_dir = tmp_path / "job"
    tier = LocalTier(job_dir, "persistent")
    for step, extra in ((10, {"reason": "periodic"}), (20, {})):
        d = tier.begin(step)
        (d / "model.pt").write_bytes(b"m" * 1024)
        tier.commit(step, build_manifest(
            d, step=step, epoch=0, world_size=1, framework="torch", tier="persistent", extra=extra
        ))  # fmt: skip
    log = tmp_path / "listing.log"
    listed = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.listing", "--persistent", str(job_dir)],
        capture_output=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    # KWOK serves the file in the container runtime's log format, as the kubelet reads it
    log.write_bytes(b"2026-03-01T12:00:00.000000000Z stdout F " + listed.stdout)

    proc = start_cli(cluster, "checkpoints", "llama", "-n", namespace, "--timeout", "60")
    name: list[str] = []

    def running_on_kwok() -> bool:
        for pod in lister_pods(cluster, namespace).values():
            if (pod.get("status") or {}).get("phase") == "Running":
                name.append(pod["metadata"]["name"])
                return True
        return False

    try:
        wait_for(running_on_kwok, "the lister pod to run", timeout=40)
        cluster.apply(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Logs",
                "metadata": {"name": name[0], "namespace": namespace},
                "spec": {"logs": [{"containers": ["list"], "logsFile": str(log)}]},
            }
        )
        ended = {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "list",
                    "image": "x",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
            ],
        }
        cluster.kubectl(
            "patch", "pod", name[0], "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": ended}),
        )  # fmt: skip
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    rows = [ln.split()[:5] for ln in out.splitlines()]
    assert rows == [
        ["TIER", "CHECKPOINT", "STEP", "STATE", "REASON"],
        ["persistent", "checkpoint-20", "20", "complete", "-"],
        ["persistent", "checkpoint-10", "10", "complete", "periodic"],
    ]
    wait_for(lambda: lister_pods(cluster, namespace) == {}, "the lister pod to go", timeout=30)
