"""s3:// storage on the real node: the demo's two-pod PyTorchJob (DDP over the pod network) with a
CheckpointPolicy whose storage is a bucket on a real S3 server (SeaweedFS, a host process that
pods reach at the node's address: LocalCluster.start_seaweedfs), the credentials in a Secret named
by `storage.secretRef`, as users give them. Preempted by `kubectl drain`: both ranks upload a
just-in-time checkpoint to the bucket, the operator recreates the pods, both resume at exactly that
step from the bucket, and the final parameters equal an uninterrupted copy's, bit for bit. Then,
after the job succeeded and after it was deleted, `kubeckpt checkpoints` lists the bucket through
a lister pod (the runtime image, then the controller image as a release's default: their s3fs;
the Secret's keys by reference) with their REASONs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from kubeckpt_api.jobkinds import PYTORCHJOB
from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.images import IMAGES
from localcluster.node import RealNode
from localcluster.pods import running, wait_pod
from localcluster.seaweedfs import SeaweedFS
from tests.support.cli_objects import run_cli
from tests.support.node_pods import (
    RUNTIME_IMAGE,
    job_succeeded,
    lister_pods,
    load_demo,
    only_the_real_node_schedulable,
    progress_record,
)
from trainer_runtime.contract import INCOMPLETE_SENTINEL, MANIFEST_FILE

pytestmark = pytest.mark.timeout(900)

BUCKET = "kubeckpt-node"
PREFIX = "runs"
SECRET = "s3-credentials"
JOB = "s3-mlp"
REFERENCE = "s3-mlp-reference"
PODS = (f"{JOB}-master-0", f"{JOB}-worker-0")
STEPS, STEP_SECONDS, SAVE_STEPS = 300, 0.1, 50
CONTROLLER = IMAGES["controller"]  # the webhook's and the reconciler's


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


def _bucket_reasons(fs: Any, job_root: str) -> dict[str, str]:
    """The job's complete checkpoints in the bucket, named as the CLI names them (relative to
    its prefix: `checkpoint-N`, or `generation-G/checkpoint-N`), with their manifest's reason."""
    fs.invalidate_cache()
    found = {}
    for key in fs.find(job_root):
        m = re.fullmatch(
            rf"((?:generation-\d+/)?checkpoint-\d+)/{MANIFEST_FILE}", key[len(job_root) + 1 :]
        )
        if m and not fs.exists(f"{job_root}/{m.group(1)}/{INCOMPLETE_SENTINEL}"):
            found[m.group(1)] = json.loads(fs.cat_file(key)).get("reason") or "-"
    return found


def _listed_through_lister(
    cluster: LocalCluster, ns: str, *extra: str, image: str = RUNTIME_IMAGE
) -> list[list[str]]:
    """`kubeckpt checkpoints JOB` through a lister pod of `image`: its table's rows (TIER,
    CHECKPOINT, STEP, STATE, REASON), once the pod is gone again."""
    cli = ("--kubeconfig", str(cluster.kubeconfig), "checkpoints", JOB, "-n", ns, *extra)
    done = run_cli(*cli, "--image", image, "--timeout", "120", timeout=180)
    assert done.returncode == 0, done.stderr
    assert f"listing through lister pod kubeckpt-ls-{JOB}-" in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert lines and lines[0].split()[:5] == ["TIER", "CHECKPOINT", "STEP", "STATE", "REASON"], (
        done.stdout
    )
    wait_for(lambda: lister_pods(cluster, ns) == [], "the lister pod to be deleted", timeout=60)
    return [ln.split()[:5] for ln in lines[1:] if ln.startswith("persistent ")]


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
            lambda: (progress_record(cluster, ns, PODS[0]).get("step") or 0) >= STEPS // 2,
            f"step {STEPS // 2}",
            timeout=240,
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{_logs(cluster, ns, PODS[0])[-4000:]}") from e
    before = int(progress_record(cluster, ns, PODS[0]).get("step") or 0)
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
        wait_for(lambda n=name: job_succeeded(cluster, ns, n), f"{name} to succeed", timeout=300)
    for p in PODS:
        assert f"finished at step {STEPS}" in _logs(cluster, ns, p), _logs(cluster, ns, p)[-3000:]
    digest, reference = _final_digest(cluster, ns, JOB), _final_digest(cluster, ns, REFERENCE)
    assert digest and digest == reference, (digest, reference)
    # The reference checkpointed into its own prefix of the same bucket, and was never resumed.
    fs.invalidate_cache()
    assert fs.find(f"{BUCKET}/{PREFIX}/{PYTORCHJOB.storage_dir(ns, REFERENCE)}")
    assert "resumed from" not in _logs(cluster, ns, f"{REFERENCE}-master-0")

    # Succeeded: its pods are left, not running. A lister pod (placed as they were) lists the
    # bucket's checkpoints with their manifests' REASONs; the one the run resumed from is marked.
    reasons = _bucket_reasons(fs, job_root)
    assert reasons, "no complete checkpoint left in the bucket"
    progress = json.loads(cluster.kubectl("get", "tp", JOB, "-n", ns, "-o", "json").stdout)
    resumed_from = (progress.get("status") or {}).get("resumedFrom")
    succeeded = _listed_through_lister(cluster, ns)
    assert {r[1] for r in succeeded} == set(reasons), (succeeded, reasons)
    for _, name, step, state, reason in succeeded:
        assert state == "complete" and name.endswith(f"checkpoint-{step}"), succeeded
        # status.resumedFrom: the checkpoint's name relative to the prefix, or its location
        resumed = resumed_from in (name, f"s3://{job_root}/{name}")
        marked = ",resumed-from" if resumed else ""
        assert reason == reasons[name] + marked, (name, reason, reasons, resumed_from)
    assert set(reasons.values()) <= {"periodic", "jit"}, reasons

    # Deleted: its pods and TrainingProgress go with it; --kind names what it was, and the
    # lister pod, with no pod to copy its placement from, goes to the real node. Its image is
    # the controller image this time: a released install's default lister image (no --image).
    cluster.kubectl("delete", "pytorchjob", JOB, "-n", ns, "--wait=true", timeout=120)
    wait_for(
        lambda: (
            cluster.kubectl("get", "tp", JOB, "-n", ns, check=False).returncode != 0
            and not cluster.kubectl(
                "get", "pods", "-n", ns, "-l", f"training.kubeflow.org/job-name={JOB}", "-o", "name"
            ).stdout.strip()
        ),
        "the job's pods and TrainingProgress to go",
        timeout=120,
    )
    with only_the_real_node_schedulable(cluster):
        deleted = _listed_through_lister(cluster, ns, "--kind", "PyTorchJob", image=CONTROLLER)
    assert [r[:4] for r in deleted] == [r[:4] for r in succeeded]
    assert {r[1]: r[4] for r in deleted} == reasons  # from the manifests alone now
