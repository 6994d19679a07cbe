"""`kubeckpt checkpoints` on the real node: the listing runs in a real container through the
kubelet's exec (containerd, runc), with the container's own env, user and filesystem; an image
without python says so in one line."""

from __future__ import annotations

import json
import textwrap

import pytest

from localcluster import LocalCluster, wait_for
from localcluster.images import IMAGES
from localcluster.pods import running, wait_pod
from tests.support.cli_objects import run_cli, tp, training_status
from tests.support.node_pods import RUNTIME_IMAGE, pod

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
