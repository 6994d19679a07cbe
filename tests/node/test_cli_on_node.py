"""`kubeckpt checkpoints` on the real node: the listing runs in a real container through the
kubelet's exec (containerd, runc), with the container's own env, user and filesystem; an image
without python says so in one line. For a job whose pods are gone (it succeeded, then was
deleted), a lister pod mounts its PVC read-only, lists it and is deleted; `--storage` on the
host's copy of the volume shows the same table."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from localcluster import LocalCluster, wait_for
from localcluster.images import IMAGES
from localcluster.pods import running, wait_pod
from tests.support.cli_objects import run_cli, tp, training_status
from tests.support.node_pods import (
    RUNTIME_IMAGE,
    lister_pods,
    load_demo,
    only_the_real_node_schedulable,
    pod,
)

pytestmark = pytest.mark.timeout(300)

# Checkpoints written by the runtime's own commit path inside the container: two complete in the
# persistent tier, one in the ramdisk tier, one that never finished; then it waits.
WRITER = textwrap.dedent(
    """
    import os, pathlib, time
    from trainer_runtime.contract import build_manifest
    from trainer_runtime.storage import LocalTier
    def save(tier, step, size, extra=None):
        d = tier.begin(step)
        (d / "model.pt").write_bytes(b"m" * size)
        m = build_manifest(
            d, step=step, epoch=0, world_size=1, framework="torch", tier=tier.name, extra=extra
        )
        tier.commit(step, m)
    persistent = LocalTier(os.environ["CHECKPOINT_URI"], "persistent")
    local = LocalTier(os.environ["CHECKPOINT_LOCAL_DIR"], "local")
    save(persistent, 10, 4096, {"reason": "periodic"})
    save(persistent, 20, 4096)
    save(local, 25, 1024, {"reason": "jit"})
    pathlib.Path(os.environ["CHECKPOINT_URI"], "checkpoint-30").mkdir()
    print("ready", flush=True)
    time.sleep(3600)
    """
)

RANK0_LABELS = {
    "training.kubeflow.org/job-name": "",
    "training.kubeflow.org/operator-name": "pytorchjob-controller",
    "training.kubeflow.org/job-role": "master",
}


def rank0_pod(job: str, container: dict) -> dict:
    p = pod(f"{job}-master-0", [container], terminationGracePeriodSeconds=1)
    p["metadata"]["labels"] = {**RANK0_LABELS, "training.kubeflow.org/job-name": job}
    return p


def test_checkpoints_listed_in_a_real_container(cluster: LocalCluster, node_ns: str) -> None:
    container = {
        "name": "pytorch",
        "image": RUNTIME_IMAGE,
        "command": ["python3", "-c", WRITER],
        "env": [
            {"name": "CHECKPOINT_URI", "value": "/ckpt/persistent"},
            {"name": "CHECKPOINT_LOCAL_DIR", "value": "/ckpt/local"},
        ],
        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
    }
    manifest = rank0_pod("llama", container)
    manifest["spec"]["volumes"] = [{"name": "ckpt", "emptyDir": {}}]
    cluster.kubectl("apply", "-n", node_ns, "-f", "-", input=json.dumps(manifest))
    wait_pod(cluster, node_ns, "llama-master-0", running, "running", timeout=90)

    def ready() -> bool:
        logs = cluster.kubectl("logs", "llama-master-0", "-n", node_ns, check=False).stdout
        return "ready" in logs

    wait_for(ready, "the checkpoints to be written", timeout=60)
    status = training_status(20, observedPod="llama-master-0")
    status["checkpointing"]["latestCheckpoint"] = "/ckpt/persistent/checkpoint-20"
    cluster.apply(tp("llama", node_ns))
    cluster.kubectl(
        "patch",
        "tp",
        "llama",
        "-n",
        node_ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )

    proc = run_cli("--kubeconfig", str(cluster.kubeconfig), "checkpoints", "llama", "-n", node_ns)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:5]]
    # Reasons from the manifests, and from the status for checkpoint-20's (it has none).
    assert [r[:5] for r in rows] == [
        ["persistent", "checkpoint-30", "30", "incomplete", "-"],
        ["local", "checkpoint-25", "25", "complete", "jit"],
        ["persistent", "checkpoint-20", "20", "complete", "periodic"],
        ["persistent", "checkpoint-10", "10", "complete", "periodic"],
    ]
    doc = json.loads(
        run_cli(
            "--kubeconfig",
            str(cluster.kubeconfig),
            "checkpoints",
            "llama",
            "-n",
            node_ns,
            "-o",
            "json",
        ).stdout
    )
    assert doc["container"] == "pytorch"
    assert [c["bytes"] for c in doc["checkpoints"]] == [0, 1024, 4096, 4096]


def test_an_image_without_python_says_so(cluster: LocalCluster, node_ns: str) -> None:
    # The pause image: no shell, no python, nothing but /pause.
    container = {"name": "pytorch", "image": IMAGES["pause"]}
    cluster.kubectl(
        "apply", "-n", node_ns, "-f", "-", input=json.dumps(rank0_pod("nopy", container))
    )
    wait_pod(cluster, node_ns, "nopy-master-0", running, "running", timeout=90)
    cluster.apply(tp("nopy", node_ns))
    cluster.kubectl(
        "patch",
        "tp",
        "nopy",
        "-n",
        node_ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": training_status(5, observedPod="nopy-master-0")}),
    )
    proc = run_cli("--kubeconfig", str(cluster.kubeconfig), "checkpoints", "nopy", "-n", node_ns)
    assert proc.returncode == 1
    assert proc.stderr == (
        "kubeckpt: pod nopy-master-0 (container pytorch) has no python3 or python: checkpoints "
        "are listed by the kubeckpt runtime (`python -m trainer_runtime.listing`) in the "
        "training container\n"
    )


# The job's checkpoints, written by the runtime into the job's directory of the PVC (mounted where
# the webhook mounts it), then the job ends: it succeeded.
FINISHING_WRITER = textwrap.dedent(
    """
    import os, pathlib
    from trainer_runtime.contract import build_manifest
    from trainer_runtime.storage import LocalTier
    def save(tier, step, size, extra=None):
        d = tier.begin(step)
        (d / "model.pt").write_bytes(b"m" * size)
        m = build_manifest(
            d, step=step, epoch=0, world_size=1, framework="torch", tier=tier.name, extra=extra
        )
        tier.commit(step, m)
    persistent = LocalTier(os.environ["CHECKPOINT_URI"], "persistent")
    save(persistent, 10, 4096, {"reason": "periodic"})
    save(persistent, 20, 2048)
    pathlib.Path(os.environ["CHECKPOINT_URI"], "checkpoint-30").mkdir()
    """
)


def table_rows(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    assert lines[0].split()[:5] == ["TIER", "CHECKPOINT", "STEP", "STATE", "REASON"], stdout
    return [ln.split()[:5] for ln in lines[1:4]]


def test_checkpoints_of_a_succeeded_then_deleted_job_through_a_lister_pod(
    cluster: LocalCluster, node_ns: str, tmp_path: Path
) -> None:
    ns, job = node_ns, "llama"
    volume = tmp_path / "volume"
    job_dir = volume / "runs" / ns / job
    job_dir.mkdir(parents=True)
    for p in [volume, *volume.rglob("*")]:
        p.chmod(0o777)  # the runtime image runs as uid 65532
    cluster.apply(load_demo().storage_objects(volume, ns))
    cluster.apply(
        {
            "apiVersion": "kubeckpt.io/v1alpha1",
            "kind": "CheckpointPolicy",
            "metadata": {"name": "default", "namespace": ns},
            "spec": {"storage": {"uri": "pvc://checkpoints/runs", "mountPath": "/mnt/kubeckpt"}},
        }
    )
    uri = f"/mnt/kubeckpt/{ns}/{job}"
    # The rank-0 pod as the webhook mounts the claim into it; it saves and ends: Succeeded
    container = {
        "name": "pytorch",
        "image": RUNTIME_IMAGE,
        "command": ["python3", "-c", FINISHING_WRITER],
        "env": [{"name": "CHECKPOINT_URI", "value": uri}],
        "volumeMounts": [
            {"name": "kubeckpt-storage", "mountPath": uri, "subPath": f"runs/{ns}/{job}"}
        ],
    }
    manifest = rank0_pod(job, container)
    manifest["spec"]["restartPolicy"] = "Never"
    manifest["spec"]["volumes"] = [
        {"name": "kubeckpt-storage", "persistentVolumeClaim": {"claimName": "checkpoints"}}
    ]
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
    # The phase, not the container state: the kubelet reports the container terminated a
    # moment before it moves the pod out of Pending/Running.
    done = wait_pod(
        cluster,
        ns,
        f"{job}-master-0",
        lambda pod: (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        "to finish",
        timeout=120,
    )
    assert done["status"]["phase"] == "Succeeded", done["status"]
    status = training_status(20, observedPod=f"{job}-master-0")
    status["checkpointing"]["latestCheckpoint"] = f"{uri}/checkpoint-20"
    status["checkpointing"]["latestCheckpointReason"] = "jit"
    cluster.apply(tp(job, ns))
    cluster.kubectl(
        "patch", "tp", job, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    cli = ("--kubeconfig", str(cluster.kubeconfig), "checkpoints", job, "-n", ns)

    # Succeeded: listed by a lister pod placed as the job's pod was, the REASON of checkpoint-20
    # from the TrainingProgress (the lister mounts the job's directory where the job had it)
    succeeded = run_cli(*cli, "--image", RUNTIME_IMAGE, "--timeout", "90", timeout=150)
    assert succeeded.returncode == 0, succeeded.stderr
    assert succeeded.stderr.startswith(
        f"kubeckpt: pod {job}-master-0 is Succeeded, not running: listing through lister pod "
        f"kubeckpt-ls-{job}-"
    )
    assert table_rows(succeeded.stdout) == [
        ["persistent", "checkpoint-30", "30", "incomplete", "-"],
        ["persistent", "checkpoint-20", "20", "complete", "jit"],
        ["persistent", "checkpoint-10", "10", "complete", "periodic"],
    ]
    doc = json.loads(
        run_cli(*cli, "--image", RUNTIME_IMAGE, "--timeout", "90", "-o", "json", timeout=150).stdout
    )
    assert doc["lister"] is True and doc["policy"] == "default"
    assert [c["location"] for c in doc["checkpoints"]][1] == f"{uri}/checkpoint-20"
    wait_for(lambda: lister_pods(cluster, ns) == [], "the lister pods to be deleted", timeout=30)

    # Deleted: no pod, no TrainingProgress; --kind names what it was
    cluster.kubectl("delete", "pod", f"{job}-master-0", "-n", ns, "--grace-period=0", "--force")
    cluster.kubectl("delete", "tp", job, "-n", ns)
    without_kind = run_cli(*cli)
    assert without_kind.returncode == 3 and "name its --kind" in without_kind.stderr
    with only_the_real_node_schedulable(cluster):
        deleted = run_cli(
            *cli, "--kind", "PyTorchJob", "--image", RUNTIME_IMAGE, "--timeout", "90", timeout=150
        )
    assert deleted.returncode == 0, deleted.stderr
    rows = table_rows(deleted.stdout)
    assert rows == [
        ["persistent", "checkpoint-30", "30", "incomplete", "-"],
        ["persistent", "checkpoint-20", "20", "complete", "-"],  # its manifest has no reason
        ["persistent", "checkpoint-10", "10", "complete", "periodic"],
    ]
    wait_for(lambda: lister_pods(cluster, ns) == [], "the lister pod to be deleted", timeout=30)

    # The same table from the host's copy of the volume (the policy's root), no cluster
    local = run_cli("checkpoints", job, "-n", ns, "--storage", str(volume / "runs"))
    assert local.returncode == 0, local.stderr
    assert table_rows(local.stdout) == rows
