"""s3:// storage on the real node: the demo's two-pod PyTorchJob (DDP over the pod network) with a
CheckpointPolicy whose storage is a bucket on a real S3 server (SeaweedFS, a host process that
pods reach at the node's address: LocalCluster.start_seaweedfs), the credentials in a Secret named
by `storage.secretRef`, as users give them. Preempted by `kubectl drain`: both ranks upload a
just-in-time checkpoint to the bucket, the operator recreates the pods, both resume at exactly that
step from the bucket, and the final parameters equal an uninterrupted copy's, bit for bit."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from kubeckpt_api.jobkinds import PYTORCHJOB
from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.node import RealNode
from localcluster.pods import running, wait_pod
from localcluster.seaweedfs import SeaweedFS
from tests.support.node_pods import load_demo
from trainer_runtime.contract import INCOMPLETE_SENTINEL, MANIFEST_FILE

pytestmark = pytest.mark.timeout(900)

BUCKET = "kubeckpt-node"
PREFIX = "runs"
SECRET = "s3-credentials"
JOB = "s3-mlp"
REFERENCE = "s3-mlp-reference"
PODS = (f"{JOB}-master-0", f"{JOB}-worker-0")
STEPS, STEP_SECONDS, SAVE_STEPS = 300, 0.1, 50


@pytest.fixture(scope="module")
def addon(cluster: LocalCluster, real_node: RealNode) -> Iterator[None]:
    kubeckpt_addon.install(cluster)
    try:
        yield
    finally:
        kubeckpt_addon.uninstall(cluster)


@pytest.fixture(scope="module")
def s3_server(cluster: LocalCluster, real_node: RealNode) -> Iterator[SeaweedFS]:
    server = cluster.start_seaweedfs()
    server.create_bucket(BUCKET)
    try:
        yield server
    finally:
        cluster.stop_seaweedfs()


def _bucket(server: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An s3fs filesystem on the server, with the pods' credentials and address."""
    for key, value in server.aws_env().items():
        monkeypatch.setenv(key, value)
    from trainer_runtime.storage import _s3_filesystem

    return _s3_filesystem()


def _logs(cluster: LocalCluster, ns: str, pod: str) -> str:
    return cluster.kubectl("logs", pod, "-n", ns, "-c", "pytorch", check=False).stdout


def _progress(cluster: LocalCluster, ns: str, pod: str) -> dict:
    out = cluster.kubectl(
        "exec", pod, "-n", ns, "-c", "pytorch", "--",
        "cat", "/var/run/kubeckpt/progress.json", check=False,
    ).stdout  # fmt: skip
    try:
        return json.loads(out)
    except ValueError:
        return {}


def _succeeded(cluster: LocalCluster, ns: str, job: str) -> bool:
    p = cluster.kubectl("get", "pytorchjob", job, "-n", ns, "-o", "json", check=False)
    if p.returncode != 0:
        return False
    conds = (json.loads(p.stdout).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conds)


def _final_digest(cluster: LocalCluster, ns: str, job: str) -> str | None:
    m = re.search(r"final parameters sha256 (\w+)", _logs(cluster, ns, f"{job}-master-0"))
    return m.group(1) if m else None


def test_pytorchjob_on_s3_drained_and_resumed_exactly(
    cluster: LocalCluster,
    real_node: RealNode,
    addon: None,
    s3_server: SeaweedFS,
    node_ns: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    demo = load_demo()
    ns = node_ns
    fs = _bucket(s3_server, monkeypatch)
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=x")
    cluster.kubectl(
        "create", "configmap", "train", "-n", ns,
        f"--from-file=train.py={demo.REPO / 'hack' / 'demo' / 'train.py'}",
    )  # fmt: skip
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(s3_server.secret(SECRET)))
    policy = demo.demo_policy(save_steps=SAVE_STEPS)
    policy["spec"]["storage"] = {"uri": f"s3://{BUCKET}/{PREFIX}", "secretRef": {"name": SECRET}}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(policy))
    for name in (JOB, REFERENCE):
        job = demo.demo_job(name, STEPS, STEP_SECONDS, tolerate=real_node.taint)
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
    first = {p: wait_pod(cluster, ns, p, running, "running", timeout=180) for p in PODS}

    # The credentials reach the container as references to the Secret, never as values.
    env = {e["name"]: e for e in first[PODS[0]]["spec"]["containers"][0]["env"]}
    assert env["CHECKPOINT_URI"]["value"].startswith(f"s3://{BUCKET}/{PREFIX}/"), env
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        assert env[key]["valueFrom"]["secretKeyRef"]["name"] == SECRET, env[key]
        assert "value" not in env[key], env[key]

    # Preempted once a periodic checkpoint is in the bucket and half the steps are done.
    job_root = f"{BUCKET}/{PREFIX}/{PYTORCHJOB.storage_dir(ns, JOB)}"

    def periodic_in_bucket() -> bool:
        fs.invalidate_cache()
        return any(k.endswith(f"/{MANIFEST_FILE}") for k in fs.find(job_root))

    try:
        wait_for(periodic_in_bucket, "a periodic checkpoint in the bucket", timeout=240)
        wait_for(
            lambda: (_progress(cluster, ns, PODS[0]).get("step") or 0) >= STEPS // 2,
            f"step {STEPS // 2}",
            timeout=240,
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{_logs(cluster, ns, PODS[0])[-4000:]}") from e
    before = int(_progress(cluster, ns, PODS[0]).get("step") or 0)
    cluster.kubectl(
        "drain", real_node.name, "--pod-selector", f"training.kubeflow.org/job-name={JOB}",
        "--delete-emptydir-data", "--ignore-daemonsets", "--timeout=300s", timeout=320,
    )  # fmt: skip
    cluster.kubectl("uncordon", real_node.name)

    uids = {p: first[p]["metadata"]["uid"] for p in PODS}
    for p in PODS:
        wait_pod(
            cluster, ns, p,
            lambda pod, p=p: pod["metadata"]["uid"] != uids[p] and running(pod),
            "recreated and running", timeout=180,
        )  # fmt: skip
    resumed = {
        p: wait_for(
            lambda p=p: re.search(
                r"resumed from (checkpoint-(\d+)) at step (\d+)", _logs(cluster, ns, p)
            ),
            f"{p} to restore",
            timeout=180,
        )
        for p in PODS
    }
    steps = {p: (int(m.group(2)), int(m.group(3))) for p, m in resumed.items()}
    assert len(set(steps.values())) == 1, steps  # both ranks, the same checkpoint and step
    ((saved, at),) = set(steps.values())
    assert saved == at >= before, (steps, before)  # the just-in-time save: no step lost

    # The just-in-time checkpoint is complete in the bucket, written to the persistent tier.
    ckpt = f"{job_root}/checkpoint-{saved}"
    fs.invalidate_cache()
    names = {k.removeprefix(ckpt + "/") for k in fs.find(ckpt)}
    assert MANIFEST_FILE in names and INCOMPLETE_SENTINEL not in names, names
    manifest = json.loads(fs.cat_file(f"{ckpt}/{MANIFEST_FILE}"))
    assert manifest["step"] == saved and manifest["tier"] == "persistent", manifest

    for name in (JOB, REFERENCE):
        wait_for(lambda n=name: _succeeded(cluster, ns, n), f"{name} to succeed", timeout=300)
    for p in PODS:
        assert f"finished at step {STEPS}" in _logs(cluster, ns, p), _logs(cluster, ns, p)[-3000:]
    digest, reference = _final_digest(cluster, ns, JOB), _final_digest(cluster, ns, REFERENCE)
    assert digest and digest == reference, (digest, reference)
    # The reference checkpointed into its own prefix of the same bucket, and was never resumed.
    fs.invalidate_cache()
    assert fs.find(f"{BUCKET}/{PREFIX}/{PYTORCHJOB.storage_dir(ns, REFERENCE)}")
    assert "resumed from" not in _logs(cluster, ns, f"{REFERENCE}-master-0")
