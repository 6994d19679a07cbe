"""s3:// storage for a TrainJob on the real node: Kubeflow Trainer v2's torch-distributed runtime
(JobSet, two `node` pods, DDP over the pod network) with a CheckpointPolicy whose storage is a
bucket on a real S3 server (SeaweedFS, a host process that pods reach at the node's address:
LocalCluster.start_seaweedfs), the credentials in a Secret named by `storage.secretRef`. Drained
at a step: both ranks upload a just-in-time checkpoint to the bucket under the TrainJob's own
prefix (`<ns>/_trainjob/<name>`), the Job controller replaces the pods (they run once the node is
uncordoned), both resume at exactly that step from the bucket, the TrainingProgress records the
resume, `kubeckpt checkpoints` lists the bucket through the rank-0 pod, and the final parameters
equal an uninterrupted TrainJob's, bit for bit. The PyTorchJob on S3: test_s3_on_node.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from kubeckpt_api.jobkinds import TRAINJOB
from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.node import RealNode
from localcluster.seaweedfs import SeaweedFS
from tests.support.cli_objects import run_cli
from tests.support.node_pods import REPO
from tests.support.trainjob_pods import (
    complete,
    events,
    job_logs,
    pods,
    sha256_of,
    torch_command,
    tp_status,
    trainjob,
    wait_rank,
)
from trainer_runtime.contract import INCOMPLETE_SENTINEL, MANIFEST_FILE

pytestmark = pytest.mark.timeout(900)

BUCKET = "kubeckpt-node-trainjob"
PREFIX = "runs"
SECRET = "s3-credentials"
JOB = "s3-tiny"
REFERENCE = "s3-tiny-reference"
# 0.15 s a step: after a drain at DRAIN_AT, the resumed run trains long enough (about 45 s) for
# the TrainingProgress and `kubeckpt checkpoints` to be read while its rank-0 pod runs.
STEPS, STEP_SECONDS, SAVE_STEPS, DRAIN_AT = 450, 0.15, 50, 150
RESUMED = re.compile(r"resumed from checkpoint-(\d+) at step (\d+)")


@pytest.fixture(scope="module")
def addon(cluster: LocalCluster, real_node: RealNode) -> Iterator[None]:
    cluster.start_trainer(status_gate=False)
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


def _prepare(cluster: LocalCluster, ns: str, server: SeaweedFS) -> None:
    """An opted-in namespace: the S3 Secret, a CheckpointPolicy on the bucket that names it, the
    training script as a ConfigMap, an HF-token-style Secret (the TrainJob's env references it)."""
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=x")
    cluster.kubectl(
        "create", "configmap", "train", "-n", ns,
        f"--from-file=train.py={REPO / 'hack' / 'demo' / 'train.py'}",
    )  # fmt: skip
    policy = {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "CheckpointPolicy",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {
            "storage": {"uri": f"s3://{BUCKET}/{PREFIX}", "secretRef": {"name": SECRET}},
            "strategy": "steps",
            "saveSteps": SAVE_STEPS,
            # Retention keeps every save: the JIT one is still there when the CLI lists it.
            "maxCheckpoints": 20,
            "jit": {"enabled": True, "maxGracePeriodSeconds": 120},
            "progress": {"updateEverySteps": 5},
        },
    }
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(server.secret(SECRET)))
    cluster.apply(policy)


def test_trainjob_on_s3_drained_and_resumed_exactly(
    cluster: LocalCluster,
    real_node: RealNode,
    addon: None,
    s3_server: SeaweedFS,
    node_ns: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ns = node_ns
    fs = _bucket(s3_server, monkeypatch)
    _prepare(cluster, ns, s3_server)
    cmd = torch_command(STEPS, STEP_SECONDS)
    cluster.apply([trainjob(n, ns, cmd, nodes=2) for n in (JOB, REFERENCE)])
    first = {r: wait_rank(cluster, ns, JOB, r, 240) for r in (0, 1)}

    # The credentials reach the `node` container as references to the Secret, never as values.
    job_root = f"{BUCKET}/{PREFIX}/{TRAINJOB.storage_dir(ns, JOB)}"
    for p in first.values():
        node = next(c for c in p["spec"]["containers"] if c["name"] == "node")
        env = {e["name"]: e for e in node["env"]}
        assert env["CHECKPOINT_URI"]["value"] == f"s3://{job_root}", env["CHECKPOINT_URI"]
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
            assert env[key]["valueFrom"]["secretKeyRef"]["name"] == SECRET, env[key]
            assert "value" not in env[key], env[key]

    # Drained once a periodic checkpoint is in the bucket and DRAIN_AT steps are done.
    def periodic_in_bucket() -> bool:
        fs.invalidate_cache()
        return any(k.endswith(f"/{MANIFEST_FILE}") for k in fs.find(job_root))

    try:
        wait_for(periodic_in_bucket, "a periodic checkpoint in the bucket", timeout=240)
        wait_for(
            lambda: (tp_status(cluster, ns, JOB).get("step") or 0) >= DRAIN_AT,
            f"step {DRAIN_AT} in the TrainingProgress",
            timeout=240,
        )
    except TimeoutError as e:
        fs.invalidate_cache()
        state = {
            "trainingProgress": tp_status(cluster, ns, JOB),
            "bucket": fs.find(f"{BUCKET}/{PREFIX}"),
            "pods": {
                p["metadata"]["name"]: p.get("status", {}).get("phase")
                for p in pods(cluster, ns, JOB)
            },
        }
        raise AssertionError(
            f"{e}\n{json.dumps(state, indent=1)[-3000:]}\n{job_logs(cluster, ns, JOB)[-4000:]}"
        ) from e
    before = int(tp_status(cluster, ns, JOB)["step"])
    cluster.kubectl(
        "drain", real_node.name, "--pod-selector", f"jobset.sigs.k8s.io/jobset-name={JOB}",
        "--delete-emptydir-data", "--ignore-daemonsets", "--timeout=300s", timeout=320,
    )  # fmt: skip
    # The Job controller created the replacements at once; the cordon kept them off the node
    # until the victims had uploaded their save and gone.
    cluster.kubectl("uncordon", real_node.name)

    uids = {p["metadata"]["uid"] for p in first.values()}
    second = {r: wait_rank(cluster, ns, JOB, r, 240) for r in (0, 1)}
    assert not uids & {p["metadata"]["uid"] for p in second.values()}, "not replaced"

    def both_restored() -> list[tuple[str, str]] | None:
        found = RESUMED.findall(job_logs(cluster, ns, JOB))
        return found if len(found) == 2 else None

    resumed = wait_for(both_restored, "both ranks to restore", timeout=180)
    assert len(set(resumed)) == 1, resumed  # both ranks, the same checkpoint and step
    ((saved_, at_),) = set(resumed)
    saved, at = int(saved_), int(at_)
    assert saved == at >= before, (resumed, before)
    # The stop's checkpoint is its own just-in-time save, or, when the drain came at a step whose
    # periodic save was already durable, that one (nothing left to save: JitStop.begin). Either
    # way no step is lost: the TrainingProgress's stepsLost and JITCheckpoint Event below.
    stop_reasons = {"jit"} if saved % SAVE_STEPS else {"jit", "periodic"}

    # The just-in-time checkpoint is complete in the bucket, both ranks' shards in it.
    ckpt = f"{job_root}/checkpoint-{saved}"
    fs.invalidate_cache()
    names = {k.removeprefix(ckpt + "/") for k in fs.find(ckpt)}
    assert MANIFEST_FILE in names and INCOMPLETE_SENTINEL not in names, names
    manifest = json.loads(fs.cat_file(f"{ckpt}/{MANIFEST_FILE}"))
    assert manifest["step"] == saved and manifest["tier"] == "persistent", manifest
    files = {f["path"] for f in manifest["files"]}
    assert {"__0_0.distcp", "__1_0.distcp"} <= files, (sorted(files), sorted(names), manifest)

    # The TrainingProgress shows the resume: from that checkpoint, one interruption, no step lost.
    def recorded() -> dict | None:
        st = tp_status(cluster, ns, JOB)
        return st if st.get("resumedFrom") == f"checkpoint-{saved}" and st.get("lifetime") else None

    st = wait_for(recorded, "the resume in the TrainingProgress", timeout=60)
    life = st["lifetime"]
    assert (life["interruptions"], life["resumes"]) == (1, 1), life
    assert life["stepsLost"] == 0 and life["lastInterruption"]["resumedStep"] == saved, life
    assert st["checkpointing"]["latestCheckpoint"].startswith(f"s3://{job_root}/checkpoint-"), st
    wait_for(
        lambda: {"JITCheckpoint", "Resumed"} <= set(events(cluster, ns, JOB)),
        "the TrainJob's JITCheckpoint and Resumed Events",
        timeout=60,
    )

    # `kubeckpt checkpoints` lists the bucket through the running rank-0 pod's `node` container.
    assert not complete(cluster, ns, JOB), "finished before the listing: lengthen STEPS"
    proc = run_cli(
        "--kubeconfig", str(cluster.kubeconfig), "checkpoints", JOB, "-n", ns, "--kind",
        "TrainJob", "-o", "json", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["container"] == "node" and doc["pod"] == second[0]["metadata"]["name"], doc
    assert [t["root"] for t in doc["tiers"]] == [f"s3://{job_root}"], doc["tiers"]
    jit = next(c for c in doc["checkpoints"] if c["step"] == saved)
    assert (jit["state"], jit.get("resumedFrom")) == ("complete", True), jit
    assert jit["reason"] in stop_reasons, jit
    assert jit["location"] == f"s3://{ckpt}", jit

    try:
        wait_for(
            lambda: complete(cluster, ns, JOB) and complete(cluster, ns, REFERENCE),
            "both TrainJobs Complete",
            timeout=300,
        )
    except TimeoutError as e:
        fs.invalidate_cache()
        state = {
            "trainingProgress": tp_status(cluster, ns, JOB),
            "bucket": fs.find(f"{BUCKET}/{PREFIX}"),
            "pods": {
                p["metadata"]["name"]: p.get("status", {}).get("phase")
                for p in pods(cluster, ns, JOB)
            },
        }
        raise AssertionError(
            f"{e}\n{json.dumps(state, indent=1)[-3000:]}\n{job_logs(cluster, ns, JOB)[-4000:]}"
        ) from e
    out, ref_out = job_logs(cluster, ns, JOB), job_logs(cluster, ns, REFERENCE)
    assert out.count(f"finished at step {STEPS}") == 2, out[-3000:]
    digest, reference = sha256_of(out), sha256_of(ref_out)
    assert digest and digest == reference, "final parameters differ from the uninterrupted run's"
    # The reference checkpointed into its own prefix of the same bucket, and was never resumed.
    fs.invalidate_cache()
    assert fs.find(f"{BUCKET}/{PREFIX}/{TRAINJOB.storage_dir(ns, REFERENCE)}")
    assert "resumed from" not in ref_out
