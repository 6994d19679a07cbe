"""TrainJobs for real: Kubeflow Trainer v2.3 and JobSet (built from their modules, run by the local
cluster) turn unchanged TrainJobs into pods on the real node, and kubeckpt, installed from
config/local, injects them, follows them and saves them on preemption.

- A TrainJob shaped like the seed documents (numNodes 2, trainer env, a PVC-backed checkpoint
  path): injected `node` containers, one TrainingProgress, status.trainerStatus in Trainer's shape
  written by kubeckpt (gate off), preempted by `spec.suspend` as Kueue does (both ranks save one
  step, the pods go), resumed on unsuspend at exactly that step, bitwise equal at the end to an
  uninterrupted TrainJob.
- An HF `train_func` TrainJob (transformers Trainer, save_steps and save_total_limit, JIT on):
  preempted by deleting its rank-0 pod (the Job replaces it while the old one still saves),
  resumed at the saved step; with Trainer's TrainJobStatus gate off kubeckpt writes trainerStatus,
  with it on Trainer's status server does (fed by transformers' KubeflowCallback) and kubeckpt
  leaves the field alone; no 100 % is reported for the preempted run.
- The replacement never resumes before the victim's save commits (trainer_runtime/handover.py),
  for a TrainJob (whose Job replaces a terminating pod at once: without the wait it resumes from
  the older checkpoint, shown here) and a PyTorchJob (whose replacement has the victim's name).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from kubeckpt_api.jobkinds import PYTORCHJOB, TRAINJOB, JobKind
from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.node import RealNode
from localcluster.pods import running
from tests.support.node_pods import load_demo
from tests.support.trainjob_pods import (
    complete,
    events,
    get,
    job_logs,
    pods,
    rank_pod,
    sha256_of,
    torch_command,
    tp_status,
    trainjob,
    trainjob_obj,
    wait_rank,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "node" / "scripts"
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def addon(cluster: LocalCluster, real_node: RealNode) -> Iterator[None]:
    cluster.start_trainer(status_gate=False)
    kubeckpt_addon.install(cluster)
    try:
        yield
    finally:
        kubeckpt_addon.uninstall(cluster)


# --- the namespace, its storage and its jobs ---


def prepare(
    cluster: LocalCluster,
    ns: str,
    volume: Path,
    jobs: list[str],
    save_steps: int,
    kind: JobKind = TRAINJOB,
) -> None:
    """An opted-in namespace: a CheckpointPolicy (pvc://checkpoints/runs), a local PV on the node
    and its claim, the scripts as a ConfigMap, an HF-token-style Secret."""
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    for job in jobs:
        d = job_dir(volume, ns, job, kind)
        d.mkdir(parents=True)
    for p in [volume, *volume.rglob("*")]:
        p.chmod(0o777)  # the training image runs as uid 1000
    cluster.apply(
        [
            *load_demo().storage_objects(volume, ns),
            {
                "apiVersion": "kubeckpt.io/v1alpha1",
                "kind": "CheckpointPolicy",
                "metadata": {"name": "default", "namespace": ns},
                "spec": {
                    "storage": {"uri": "pvc://checkpoints/runs", "mountPath": "/mnt/kubeckpt"},
                    "strategy": "steps",
                    "saveSteps": save_steps,
                    "maxCheckpoints": 3,
                    "jit": {"enabled": True, "maxGracePeriodSeconds": 120},
                    "progress": {"updateEverySteps": 5},
                },
            },
        ]
    )
    cluster.kubectl(
        "create",
        "configmap",
        "train",
        "-n",
        ns,
        f"--from-file=train.py={REPO / 'hack' / 'demo' / 'train.py'}",
        f"--from-file=hf_train_func.py={SCRIPTS / 'hf_train_func.py'}",
        f"--from-file=slow_commit.py={SCRIPTS / 'slow_commit.py'}",
        f"--from-file=tiny_hf.py={REPO / 'tests' / 'runtime' / 'hf' / 'tiny_hf.py'}",
    )
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=x")


# --- reading the cluster ---


def status_managers(obj: dict) -> dict[str, dict]:
    return {
        f["manager"]: f.get("fieldsV1", {})
        for f in obj["metadata"].get("managedFields") or []
        if f.get("subresource") == "status"
    }


def logs(cluster: LocalCluster, ns: str, pod: str, *extra: str) -> str:
    return cluster.kubectl("logs", pod, "-n", ns, "-c", "node", *extra, check=False).stdout


def follow_logs(cluster: LocalCluster, ns: str, pod: str) -> subprocess.Popen[str]:
    """`kubectl logs -f` of a pod's node container: the whole log, even once the pod is gone."""
    assert cluster.binaries is not None
    kubectl = [str(cluster.binaries.kubectl), "--kubeconfig", str(cluster.kubeconfig)]
    proc = subprocess.Popen(
        [*kubectl, "logs", "-f", pod, "-n", ns, "-c", "node"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return proc


def victim_exit(proc: subprocess.Popen[str], timeout: float = 300) -> dict:
    """The exit record (step, stopped, resumed_from) rank 0 printed before its pod ended."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    m = re.search(r'\[rank 0\] (\{"step".*\})', out)
    assert m, f"rank 0 printed no exit record: {out[-2000:]}"
    return json.loads(m.group(1))


def job_dir(volume: Path, ns: str, job: str, kind: JobKind = TRAINJOB) -> Path:
    """The job's directory on the claim (pvc://checkpoints/runs): its kind's own."""
    return volume / "runs" / kind.storage_dir(ns, job)


def checkpoints(volume: Path, ns: str, job: str, kind: JobKind = TRAINJOB) -> dict[int, bool]:
    """Step -> complete, as the volume on the host shows it."""
    root = job_dir(volume, ns, job, kind)
    out = {}
    for d in root.glob("checkpoint-*"):
        if d.name.removeprefix("checkpoint-").isdigit():
            complete_ = (d / "manifest.json").exists() and not (
                d / "checkpoint-is-incomplete.txt"
            ).exists()
            out[int(d.name.removeprefix("checkpoint-"))] = complete_
    return out


def patch_suspend(cluster: LocalCluster, ns: str, job: str, suspend: bool) -> float:
    t = time.time()
    cluster.kubectl(
        "patch",
        "trainjob",
        job,
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"suspend": suspend}}),
    )
    return t


def log_time(stamped: str, pattern: str) -> float | None:
    """The time of the first line (from `kubectl logs --timestamps`) matching `pattern`."""
    for line in stamped.splitlines():
        stamp, _, text = line.partition(" ")
        if re.search(pattern, text):
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


# --- the tests ---


def test_trainjob_injected_preempted_by_suspend_resumed_exactly(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path
) -> None:
    ns, job, ref = node_ns, "tiny", "tiny-reference"
    volume = tmp_path / "volume"
    prepare(cluster, ns, volume, [job, ref], save_steps=50)
    env = [{"name": "LEARNING_RATE", "value": "0.003"}]  # as the seeds' trainer env
    cmd = torch_command(300, 0.1)
    cluster.apply([trainjob(n, ns, cmd, nodes=2, env=env) for n in (job, ref)])

    first = {r: wait_rank(cluster, ns, job, r, 240) for r in (0, 1)}
    for p in first.values():
        labels, ann = p["metadata"]["labels"], p["metadata"]["annotations"]
        assert labels.get("kubeckpt.io/injected") == "true", labels
        assert json.loads(ann["kubeckpt.io/status"])["container"] == "node"
        node = next(c for c in p["spec"]["containers"] if c["name"] == "node")
        env_ = {e["name"]: e.get("value") for e in node["env"]}
        assert env_["CHECKPOINT_URI"] == f"/mnt/kubeckpt/{TRAINJOB.storage_dir(ns, job)}", env_
        assert env_["KUBECKPT_JOB_KIND"] == "TrainJob" and env_["KUBECKPT_JOB_NAME"] == job
        assert node["lifecycle"]["preStop"]["exec"]["command"]
        assert p["spec"]["terminationGracePeriodSeconds"] >= 30

    wait_for(
        lambda: (tp_status(cluster, ns, job).get("step") or 0) >= 60, "progress past step 60", 180
    )
    tps = get(cluster, "tp", "-n", ns)["items"]
    assert sorted(t["metadata"]["name"] for t in tps) == [job, ref]  # one per TrainJob
    tp = next(t for t in tps if t["metadata"]["name"] == job)
    assert tp["spec"]["jobRef"] == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": job,
    }
    assert tp["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"

    # Gate off: kubeckpt writes status.trainerStatus in Trainer's shape.
    def trainer_status() -> dict | None:
        obj = trainjob_obj(cluster, ns, job)
        ts = (obj.get("status") or {}).get("trainerStatus") or {}
        return obj if ts.get("progressPercentage") else None

    obj = wait_for(trainer_status, "status.trainerStatus", 60)
    ts = obj["status"]["trainerStatus"]
    assert {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"} <= set(
        ts
    )
    assert {m["name"] for m in ts["metrics"]} >= {"loss", "currentStep", "totalSteps"}
    assert "f:trainerStatus" in json.dumps(status_managers(obj).get("kubeckpt", {}))

    # Preempted as Kueue does it: suspend. Trainer suspends the JobSet, the Job controller deletes
    # the pods gracefully, the injected preStop asks for a just-in-time checkpoint.
    t_suspend = patch_suspend(cluster, ns, job, True)
    wait_for(lambda: not pods(cluster, ns, job), "the suspended TrainJob's pods to go", 120)
    ckpts = checkpoints(volume, ns, job)
    # The newest checkpoint: the stop's own save, or the periodic one when the stop came at a
    # step already saved (JitStop.begin); the TrainingProgress's reason says "jit" either way.
    saved = max(s for s, ok in ckpts.items() if ok)
    manifest = job_dir(volume, ns, job) / f"checkpoint-{saved}" / "manifest.json"
    files = {f["path"] for f in json.loads(manifest.read_text())["files"]}
    assert {"__0_0.distcp", "__1_0.distcp"} <= files, files  # both ranks, one step
    t_committed = manifest.stat().st_mtime
    st = wait_for(
        lambda: (
            (s := tp_status(cluster, ns, job))
            .get("checkpointing", {})
            .get("latestCheckpointReason")
            == "jit"
            and s
        ),
        "the JIT checkpoint in the TrainingProgress",
        60,
    )
    assert st["checkpointing"]["latestCheckpoint"].endswith(f"checkpoint-{saved}")
    assert "JITCheckpoint" in events(cluster, ns, job)

    def suspended() -> dict | None:
        conds = tp_status(cluster, ns, job).get("conditions") or []
        c = next((c for c in conds if c["type"] == "Progressing"), None)
        return c if c and c["status"] == "False" and c["reason"] == "Suspended" else None

    cond = wait_for(suspended, "the TrainingProgress to say Suspended", 60)
    assert f"checkpoint-{saved}" in cond["message"], cond

    t_resume = patch_suspend(cluster, ns, job, False)
    resumed_pattern = rf"resumed from checkpoint-{saved} at step {saved}\b"
    second = wait_rank(cluster, ns, job, 0, 240)
    stamped = wait_for(
        lambda: (
            (out := logs(cluster, ns, second["metadata"]["name"], "--timestamps"))
            and re.search(resumed_pattern, out)
            and out
        ),
        "the resumed run's first line",
        180,
    )
    t_first = log_time(stamped, resumed_pattern)
    assert t_first is not None

    wait_for(
        lambda: complete(cluster, ns, job) and complete(cluster, ns, ref),
        "both TrainJobs Complete",
        300,
    )
    out, ref_out = job_logs(cluster, ns, job), job_logs(cluster, ns, ref)
    assert len(re.findall(resumed_pattern, out)) == 2, out[-3000:]  # both ranks, the same step
    digest, ref_digest = sha256_of(out), sha256_of(ref_out)
    assert digest and digest == ref_digest, "final parameters differ from the uninterrupted run's"
    print(
        f"\nfigures: suspend -> checkpoint-{saved} committed {t_committed - t_suspend:.1f} s; "
        f"unsuspend -> restored, training again {t_first - t_resume:.1f} s"
    )


@pytest.mark.parametrize("gate", [False, True], ids=["gate-off", "gate-on"])
def test_hf_train_func_trainjob_preempted_by_pod_deletion(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path, gate: bool
) -> None:
    cluster.start_trainer(status_gate=gate)
    ns, job, ref = node_ns, "hf-jit", "hf-reference"
    volume = tmp_path / "volume"
    # The Trainer's own save_steps decide periodic saves here. With the gate off, an
    # uninterrupted copy runs beside it, to compare the final parameters with.
    jobs = [job] if gate else [job, ref]
    prepare(cluster, ns, volume, jobs, save_steps=1000)
    cmd = "torchrun /scripts/hf_train_func.py --steps=80 --save-steps=20 --sleep=0.25"
    cluster.apply([trainjob(n, ns, cmd, nodes=2) for n in jobs])
    first = wait_rank(cluster, ns, job, 0, 240)
    node = next(c for c in first["spec"]["containers"] if c["name"] == "node")
    has_server = any(e["name"] == "KUBEFLOW_TRAINER_SERVER_URL" for e in node["env"])
    assert has_server is gate
    wait_for(
        lambda: 20 in checkpoints(volume, ns, job) and checkpoints(volume, ns, job)[20],
        "the periodic checkpoint-20",
        240,
    )
    wait_for(
        lambda: (tp_status(cluster, ns, job).get("step") or 0) >= 25, "progress past step 25", 60
    )
    out = logs(cluster, ns, first["metadata"]["name"])
    assert f"KubeflowCallback active: {gate}" in out, out[-2000:]

    # Preempted by deleting rank 0's pod: the Job replaces it at once, while it still saves.
    # Its log, followed from before the deletion, names the step it stopped at.
    victim_log = follow_logs(cluster, ns, first["metadata"]["name"])
    cluster.kubectl("delete", "pod", first["metadata"]["name"], "-n", ns, "--wait=false")
    resumed = wait_for(
        lambda: (
            (m := re.search(r'"resumed_from": "[^"]*checkpoint-(\d+)"', job_logs(cluster, ns, job)))
            and m
        ),
        "a resumed run",
        300,
    )
    wait_for(lambda: all(complete(cluster, ns, n) for n in jobs), "the TrainJobs Complete", 300)
    if not gate:
        digest, ref_digest = (
            sha256_of(job_logs(cluster, ns, job)),
            sha256_of(job_logs(cluster, ns, ref)),
        )
        assert digest and digest == ref_digest, (
            "final parameters differ from the uninterrupted run's"
        )
    step = int(resumed.group(1))
    ckpts = checkpoints(volume, ns, job)
    stopped = victim_exit(victim_log)
    assert stopped["stopped"] is True, stopped
    # Resumed at exactly the victim's last step: its JIT save, or the periodic one when the stop
    # fell on a save_steps boundary (that step was durable already, so nothing was saved twice).
    assert step == stopped["step"], f"stopped at {stopped['step']}, resumed from {step} ({ckpts})"
    assert sorted(s for s, ok in ckpts.items() if ok)[-1] == 80  # the final save
    assert len([s for s, ok in ckpts.items() if ok]) <= 2  # save_total_limit=2
    if step % 20:
        assert "JITCheckpoint" in events(cluster, ns, job)
    obj = trainjob_obj(cluster, ns, job)
    managers = status_managers(obj)
    if gate:
        # Trainer's status server owns trainerStatus (KubeflowCallback posted it); kubeckpt
        # kept to its TrainingProgress.
        assert "trainer-status" in managers, managers
        assert "f:trainerStatus" not in json.dumps(managers.get("kubeckpt", {}))
        assert obj["status"]["trainerStatus"]["progressPercentage"] == 100
    else:
        assert "trainer-status" not in managers
        assert "f:trainerStatus" in json.dumps(managers.get("kubeckpt", {}))
    assert tp_status(cluster, ns, job).get("step") == 80


# --- the replacement and the victim's save ---

SLOW_COMMIT = 20  # seconds the JIT commit takes (slow_commit.py): longer than a pod takes to start
# 30 steps between periodic saves last 6 s: the JIT step falls between checkpoint-30 and 60.
HANDOVER_STEPS = "--steps=400 --step-seconds=0.2"


def _resumed_from(text: str) -> int | None:
    m = re.search(r"resumed from checkpoint-(\d+) at step", text)
    return int(m.group(1)) if m else None


def _preempt_and_watch_replacement(
    cluster: LocalCluster, ns: str, victim: dict, find_rank0
) -> tuple[dict, bool]:
    """Delete the victim pod; return its replacement, and whether the replacement existed while
    the victim was still terminating."""
    name, uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
    overlap = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = find_rank0()
        old = cluster.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
        victim_alive = old.returncode == 0 and json.loads(old.stdout)["metadata"]["uid"] == uid
        if new is not None and new["metadata"]["uid"] != uid:
            overlap = overlap or victim_alive
            return new, overlap
        time.sleep(0.3)
    raise AssertionError("no replacement pod within 120 s")


@pytest.mark.parametrize("handover", [True, False], ids=["handover", "without-handover"])
def test_trainjob_replacement_resumes_only_after_the_victims_save(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path, handover: bool
) -> None:
    """A TrainJob's Job replaces a deleted pod at once. The victim's just-in-time save takes
    SLOW_COMMIT s to commit; the replacement starts meanwhile. With kubeckpt's handover it waits
    and resumes at the JIT step; without it (what kubeckpt did before) it resumes from the older
    periodic checkpoint and deletes the one being written."""
    cluster.start_trainer(status_gate=False)
    ns, job = node_ns, "handover"
    volume = tmp_path / "volume"
    prepare(cluster, ns, volume, [job], save_steps=30)
    env = [{"name": "SLOW_COMMIT_SECONDS", "value": str(SLOW_COMMIT)}]
    if not handover:
        env.append({"name": "NO_HANDOVER_WAIT", "value": "1"})
    cmd = f"python /scripts/slow_commit.py /scripts/train.py {HANDOVER_STEPS}"
    cluster.apply(trainjob(job, ns, cmd, nodes=1, env=env))
    victim = wait_rank(cluster, ns, job, 0, 240)
    wait_for(lambda: checkpoints(volume, ns, job).get(30), "the periodic checkpoint-30", 120)
    replacement, overlap = _preempt_and_watch_replacement(
        cluster, ns, victim, lambda: rank_pod(cluster, ns, job, 0)
    )
    assert overlap, "the Job should create the replacement while the victim terminates"
    name = replacement["metadata"]["name"]
    out = wait_for(
        lambda: (text := logs(cluster, ns, name)) and _resumed_from(text) is not None and text,
        "the replacement's restore",
        180,
    )
    resumed = _resumed_from(out)
    victim_log = logs(cluster, ns, victim["metadata"]["name"])  # may be gone: then ""
    ckpts = checkpoints(volume, ns, job)
    jit = [s for s in ckpts if s % 30 != 0]
    if handover:
        assert jit and ckpts[jit[0]], f"the JIT checkpoint is not complete: {ckpts}"
        assert resumed == jit[0], f"resumed from {resumed}, not the JIT step {jit[0]} ({ckpts})"
        assert "being written by another process" in out, out[-2000:]
    else:
        assert resumed is not None and resumed % 30 == 0, (
            f"without the handover the replacement should have resumed from a periodic "
            f"checkpoint, not {resumed} ({ckpts})\n{victim_log[-1500:]}"
        )
        assert not jit, f"the JIT save should have been deleted under its writer: {ckpts}"


def test_pytorchjob_replacement_comes_after_the_victim(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path
) -> None:
    """A PyTorchJob's replacement pod has the victim's name, so the operator can only create it
    once the victim is gone: its save is committed by then, with or without the handover."""
    demo = load_demo()
    ns, job = node_ns, "pt-handover"
    volume = tmp_path / "volume"
    prepare(cluster, ns, volume, [job], save_steps=30, kind=PYTORCHJOB)
    pj = demo.demo_job(job, 400, 0.1, tolerate=True)
    del pj["spec"]["pytorchReplicaSpecs"]["Worker"]
    c = pj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    c["command"] = [
        "bash",
        "-c",
        f"cd /tmp && python /scripts/slow_commit.py /scripts/train.py {HANDOVER_STEPS}",
    ]
    c["env"] += [
        {"name": "SLOW_COMMIT_SECONDS", "value": str(SLOW_COMMIT)},
        {"name": "PYTHONPATH", "value": "/scripts"},
    ]
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(pj))
    pod = f"{job}-master-0"

    def master() -> dict | None:
        p = cluster.kubectl("get", "pod", pod, "-n", ns, "-o", "json", check=False)
        obj = json.loads(p.stdout) if p.returncode == 0 else None
        return obj if obj and not obj["metadata"].get("deletionTimestamp") else None

    victim = wait_for(lambda: (m := master()) and running(m) and m, "the master running", 240)
    wait_for(
        lambda: checkpoints(volume, ns, job, PYTORCHJOB).get(30), "the periodic checkpoint-30", 120
    )
    t0 = time.time()
    _, overlap = _preempt_and_watch_replacement(cluster, ns, victim, master)
    assert not overlap
    ckpts = checkpoints(volume, ns, job, PYTORCHJOB)
    jit = [s for s in ckpts if s % 30 != 0]
    assert jit and ckpts[jit[0]], ckpts
    assert time.time() - t0 >= SLOW_COMMIT - 1  # the victim lived through its commit
    out = wait_for(
        lambda: (
            (text := cluster.kubectl("logs", pod, "-n", ns, check=False).stdout)
            and _resumed_from(text) is not None
            and text
        ),
        "the replacement's restore",
        180,
    )
    assert _resumed_from(out) == jit[0]
