"""kubeckpt installed for real (`kubectl apply -k config/local`: the webhook and reconciler
Deployments on the real node, from the images `make images` built), and the demo's scenario on it
with assertions: an unchanged two-pod PyTorchJob (DDP over the pod network) injected by the
in-cluster webhook, its progress read by the in-cluster reconciler through the kubelet's exec,
preempted by `kubectl drain` (the kubelet runs the injected preStop, both ranks save one step,
the containers exit 0), recreated by the operator, resumed at exactly that step on both ranks,
bitwise equal at the end to an uninterrupted run, Completed, with JITCheckpoint and Resumed
Events once each and the final status read from the termination message."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from gen_dashboard import queries, variable_queries

from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.images import IMAGES
from localcluster.node import NODE_NAME, RealNode
from localcluster.pods import running, wait_pod
from tests.support.node_pods import load_demo
from tests.support.prometheus import Prometheus, scrape_config

REPO = Path(__file__).resolve().parents[2]
SYSTEM_NS = kubeckpt_addon.SYSTEM_NS
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def addon(cluster: LocalCluster, real_node: RealNode) -> Iterator[None]:
    kubeckpt_addon.install(cluster)
    try:
        yield
    finally:
        kubeckpt_addon.uninstall(cluster)


def test_install_runs_for_real(cluster: LocalCluster, addon: None) -> None:
    for name in ("kubeckpt-webhook", "kubeckpt-reconciler"):
        d = json.loads(
            cluster.kubectl("get", "deployment", name, "-n", SYSTEM_NS, "-o", "json").stdout
        )
        assert d["status"].get("availableReplicas") == 2, d["status"]
    pods = json.loads(cluster.kubectl("get", "pods", "-n", SYSTEM_NS, "-o", "json").stdout)["items"]
    assert len(pods) == 4
    for p in pods:
        assert p["spec"]["nodeName"] == NODE_NAME
        uid = cluster.kubectl(
            "exec",
            p["metadata"]["name"],
            "-n",
            SYSTEM_NS,
            "--",
            "python",
            "-c",
            "import os; print(os.getuid())",
        ).stdout.strip()
        assert uid == "65532"
    mwc = json.loads(
        cluster.kubectl(
            "get", "mutatingwebhookconfiguration", "kubeckpt-webhook", "-o", "json"
        ).stdout
    )
    assert all(w["clientConfig"].get("caBundle") for w in mwc["webhooks"])
    lease = json.loads(
        cluster.kubectl("get", "lease", "kubeckpt-reconciler", "-n", SYSTEM_NS, "-o", "json").stdout
    )
    # The identity is "<pod>_<uuid>" (one per process start).
    assert lease["spec"]["holderIdentity"].split("_")[0] in {p["metadata"]["name"] for p in pods}


def test_demo_scenario_preempts_and_resumes_exactly(
    cluster: LocalCluster, addon: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = load_demo()
    args = argparse.Namespace(fast=True, reference=True, keep=False)
    rc = demo.run(args, tmp_path, cluster)
    out = capsys.readouterr().out
    assert rc == 0, out[-8000:]
    assert "PASS: kubeckpt demo" in out
    assert "[FAILED]" not in out, out[-8000:]
    # What the demo checked, named here so that a silent change of its checks shows.
    for what in (
        "both ranks resumed at exactly one step",
        "no step lost",
        "final parameters bitwise equal to the uninterrupted run's",
        "Events JITCheckpoint x1, Resumed x1",
        "the final status read from the terminationMessage",
        "kubectl describe tp lists the JITCheckpoint and Resumed Events",
    ):
        assert what in out, what
    assert re.search(r"tp -w \| tiny-mlp\s+tiny-mlp\s+Training\s+\d+", out), (
        "kubectl get tp -w showed no row"
    )


RAM_JOB = "ram-full"


def _exec(cluster: LocalCluster, ns: str, pod: str, *argv: str, check: bool = True) -> str:
    return cluster.kubectl("exec", pod, "-n", ns, "-c", "pytorch", "--", *argv, check=check).stdout


def _record(cluster: LocalCluster, ns: str, pod: str) -> dict:
    out = _exec(cluster, ns, pod, "cat", "/var/run/kubeckpt/progress.json", check=False)
    try:
        return json.loads(out)
    except ValueError:
        return {}


FILL = """
import os, sys
path = sys.argv[1]
with open(path, "wb") as f:
    try:
        while True:
            f.write(b"\\0" * 65536)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        print("filled", e.errno)
"""


def test_full_ramdisk_tier_fails_the_save_clearly_and_training_goes_on(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path
) -> None:
    """The ramdisk tier is a real tmpfs of its sizeLimit: filled up, the next local save fails
    with ENOSPC, reported in the progress record; training goes on; the previous local
    checkpoint stays complete."""
    demo = load_demo()
    ns = node_ns
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    storage = tmp_path / "volume"
    (storage / "runs" / ns / RAM_JOB).mkdir(parents=True)
    for p in (storage, storage / "runs", storage / "runs" / ns, storage / "runs" / ns / RAM_JOB):
        p.chmod(0o777)
    cluster.apply(demo.storage_objects(storage, ns))
    _job_inputs(cluster, ns)
    policy = demo.demo_policy(save_steps=100000)  # the persistent tier stays out of the way
    policy["spec"]["localTier"] = {"enabled": True, "sizeLimit": "8Mi", "periodSteps": 20}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(policy))
    job = _single_job(demo, RAM_JOB, 3000, 0.05)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
    pod = f"{RAM_JOB}-master-0"
    wait_pod(cluster, ns, pod, running, "running", timeout=180)
    mounts = _exec(cluster, ns, pod, "cat", "/proc/mounts")
    # (/var/run is a link to /run in Debian images: the mount table shows the resolved path.)
    where = ("/var/run/kubeckpt/local", "/run/kubeckpt/local")
    local = [ln.split() for ln in mounts.splitlines() if ln.split()[1] in where]
    assert local and local[0][2] == "tmpfs" and "size=8192k" in local[0][3], mounts

    def first_local() -> str | None:
        names = _exec(cluster, ns, pod, "ls", "/var/run/kubeckpt/local", check=False).split()
        done = [n for n in names if n.startswith("checkpoint-")]
        return sorted(done, key=lambda n: int(n.split("-")[1]))[-1] if done else None

    kept = wait_for(first_local, "a local checkpoint", timeout=120)
    out = _exec(cluster, ns, pod, "python", "-c", FILL, "/var/run/kubeckpt/local/filler")
    assert "filled 28" in out, out

    def failed() -> dict | None:
        rec = _record(cluster, ns, pod)
        ck = rec.get("checkpointing") or {}
        return rec if (ck.get("failedSaves") or 0) >= 1 else None

    rec = wait_for(failed, "a failed local save in the progress record", timeout=120)
    error = rec["checkpointing"].get("lastError", "")
    assert "No space left" in error or "28" in error, error
    step_at_failure = rec["step"]
    wait_for(
        lambda: _record(cluster, ns, pod).get("step", 0) >= step_at_failure + 20,
        "training to go on after the failed save",
        timeout=60,
    )
    files = _exec(cluster, ns, pod, "ls", f"/var/run/kubeckpt/local/{kept}").split()
    assert "manifest.json" in files, files


def _job_inputs(cluster: LocalCluster, ns: str) -> None:
    """What the demo's job references: its script (a ConfigMap) and the HF-token-style Secret."""
    script = REPO / "hack" / "demo" / "train.py"
    cluster.kubectl("create", "configmap", "train", "-n", ns, f"--from-file=train.py={script}")
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=x")


def _single_job(demo: ModuleType, name: str, steps: int, step_seconds: float) -> dict:
    """The demo's job with its master only (one pod, one rank)."""
    job = demo.demo_job(name, steps, step_seconds, tolerate=True)
    del job["spec"]["pytorchReplicaSpecs"]["Worker"]
    c = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    c["command"][-1] = c["command"][-1].replace("--nnodes=2", "--nnodes=1")
    return job


def _opted_in(cluster: LocalCluster, demo: ModuleType, ns: str) -> None:
    """An opted-in namespace whose policy keeps checkpoints in the pod (no volume needed)."""
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    _job_inputs(cluster, ns)
    policy = demo.demo_policy(save_steps=50)
    policy["spec"]["storage"] = {"uri": "file:///tmp/checkpoints"}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(policy))


def _job_events(cluster: LocalCluster, ns: str, job: str) -> list[dict]:
    """The job's Events, each repeated `count` times (an Event sent twice is aggregated)."""
    out = cluster.kubectl(
        "get",
        "events",
        "-n",
        ns,
        "-o",
        "json",
        "--field-selector",
        f"involvedObject.name={job},involvedObject.kind=PyTorchJob",
    ).stdout
    return [e for e in json.loads(out)["items"] for _ in range(e.get("count") or 1)]


def _events(cluster: LocalCluster, ns: str, job: str) -> list[str]:
    return [e["reason"] for e in _job_events(cluster, ns, job)]


def test_webhook_down_fails_open_and_the_reconciler_marks_not_injected(
    cluster: LocalCluster, addon: None, node_ns: str
) -> None:
    demo = load_demo()
    _opted_in(cluster, demo, node_ns)
    cluster.kubectl("scale", "deployment", "kubeckpt-webhook", "-n", SYSTEM_NS, "--replicas=0")
    try:
        cluster.kubectl(
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "app.kubernetes.io/component=webhook",
            "-n",
            SYSTEM_NS,
            "--timeout=60s",
            timeout=80,
        )
        job = _single_job(demo, "uninjected", 20, 0.05)
        cluster.kubectl("apply", "-n", node_ns, "-f", "-", input=json.dumps(job))
        pod = wait_pod(
            cluster, node_ns, "uninjected-master-0", lambda p: True, "created", timeout=60
        )
        assert "kubeckpt.io/injected" not in pod["metadata"].get("labels", {})
        wait_for(
            lambda: "NotInjected" in _events(cluster, node_ns, "uninjected"),
            "the NotInjected Event",
            timeout=60,
        )
    finally:
        cluster.kubectl("scale", "deployment", "kubeckpt-webhook", "-n", SYSTEM_NS, "--replicas=2")
        cluster.kubectl(
            "rollout",
            "status",
            "deployment/kubeckpt-webhook",
            "-n",
            SYSTEM_NS,
            "--timeout=120s",
            timeout=140,
        )


def test_reconciler_leader_killed_the_other_takes_over_without_duplicate_events(
    cluster: LocalCluster, addon: None, node_ns: str
) -> None:
    demo = load_demo()
    _opted_in(cluster, demo, node_ns)
    job = _single_job(demo, "takeover", 500, 0.1)
    cluster.kubectl("apply", "-n", node_ns, "-f", "-", input=json.dumps(job))

    def tp() -> dict:
        p = cluster.kubectl("get", "tp", "takeover", "-n", node_ns, "-o", "json", check=False)
        return (json.loads(p.stdout).get("status") or {}) if p.returncode == 0 else {}

    wait_for(lambda: "CheckpointSaved" in _events(cluster, node_ns, "takeover"), "a save", 180)

    def holder() -> str:
        return cluster.kubectl(
            "get",
            "lease",
            "kubeckpt-reconciler",
            "-n",
            SYSTEM_NS,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ).stdout

    leader = holder()
    cluster.kubectl(
        "delete", "pod", leader.split("_")[0], "-n", SYSTEM_NS, "--grace-period=0", "--force"
    )
    new = wait_for(lambda: (h := holder()) and h != leader and h, "a new leader", timeout=60)
    step = tp().get("step", 0)
    wait_for(lambda: tp().get("step", 0) > step, f"{new} to follow the job", timeout=60)
    wait_for(
        lambda: any(
            c["type"] == "Completed" and c["status"] == "True" for c in tp().get("conditions", [])
        ),
        "the job to complete",
        timeout=180,
    )
    reasons = _events(cluster, node_ns, "takeover")
    assert reasons.count("Completed") == 1, reasons
    saves = [r for r in reasons if r == "CheckpointSaved"]
    # One Event per checkpoint (every 50 of 500 steps, plus the final one at most).
    assert 1 <= len(saves) <= 11, reasons
    messages = [
        e["message"]
        for e in _job_events(cluster, node_ns, "takeover")
        if e["reason"] == "CheckpointSaved"
    ]
    assert len(messages) == len(set(messages)), messages  # no checkpoint announced twice
    cluster.kubectl(
        "rollout",
        "status",
        "deployment/kubeckpt-reconciler",
        "-n",
        SYSTEM_NS,
        "--timeout=120s",
        timeout=140,
    )


ZC_JOB = "zerocode-lora"
HF_SCRIPTS = REPO / "tests" / "runtime" / "hf"


def test_zero_code_hf_job_preempted_and_resumed(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path
) -> None:
    """An unmodified HF Trainer script (LoRA on a tiny Llama, no kubeckpt import) with
    instrumentation.auto: the runtime arrives by the init container into a read-only volume on
    PYTHONPATH; `kubectl delete pod` saves it just in time (exit 143, so the operator restarts
    it), and the recreated pod resumes at that step by itself and completes."""
    demo = load_demo()
    ns = node_ns
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    storage = tmp_path / "volume"
    job_dir = storage / "runs" / ns / ZC_JOB
    job_dir.mkdir(parents=True)
    for p in (storage, storage / "runs", job_dir.parent, job_dir):
        p.chmod(0o777)
    cluster.apply(demo.storage_objects(storage, ns))
    cluster.kubectl(
        "create",
        "configmap",
        "train",
        "-n",
        ns,
        f"--from-file=zerocode_job.py={HF_SCRIPTS / 'zerocode_job.py'}",
        f"--from-file=tiny_hf.py={HF_SCRIPTS / 'tiny_hf.py'}",
    )
    policy = demo.demo_policy(save_steps=1000)
    policy["spec"]["instrumentation"] = {"auto": True}
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(policy))
    job = _single_job(demo, ZC_JOB, 1, 0.1)
    c = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    c["env"] = []  # no Secret here
    c["command"] = [
        "bash",
        "-c",
        # torchrun, as HF jobs on Kubeflow are run (the operator's WORLD_SIZE alone would make
        # accelerate expect a process group that a plain `python` never starts).
        "torchrun --standalone --nproc-per-node=1 /scripts/zerocode_job.py "
        "--status-dir /tmp/status --output-dir /tmp/out "
        '--epochs 3 --sleep 0.3; rc=$?; echo "training exited $rc"; exit $rc',
    ]
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
    pod = f"{ZC_JOB}-master-0"
    first = wait_pod(cluster, ns, pod, running, "running", timeout=180)
    spec = first["spec"]
    init = {i["name"]: i for i in spec.get("initContainers", [])}
    assert init["kubeckpt-runtime"]["image"] == IMAGES["runtime"], init
    main = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    assert env["PYTHONPATH"].startswith("/var/run/kubeckpt-runtime"), env["PYTHONPATH"]
    mount = next(m for m in main["volumeMounts"] if m["name"] == "kubeckpt-runtime")
    assert mount.get("readOnly") is True
    try:
        wait_for(
            lambda: _record(cluster, ns, pod).get("step", 0) >= 10, "the Trainer past step 10", 180
        )
    except TimeoutError as e:
        logs = cluster.kubectl("logs", pod, "-n", ns, "--all-containers", check=False)
        raise AssertionError(f"{e}\n{logs.stdout[-4000:]}{logs.stderr[-1000:]}") from e
    uid = first["metadata"]["uid"]
    cluster.kubectl("delete", "pod", pod, "-n", ns, "--wait=false")
    second = wait_pod(
        cluster, ns, pod, lambda p: p["metadata"]["uid"] != uid and running(p), "recreated", 180
    )
    assert second["metadata"]["labels"].get("kubeckpt.io/injected") == "true"
    resumed = wait_for(
        lambda: (r := _record(cluster, ns, pod)).get("resumedFrom") and r,
        "the resume",
        timeout=180,
    )
    jit_step = int(resumed["resumedFrom"].split("-")[1])
    assert jit_step >= 10
    assert (job_dir / f"checkpoint-{jit_step}" / "manifest.json").is_file()
    wait_for(
        lambda: job_condition(cluster, ns, ZC_JOB, "Succeeded") == "True", "the job", timeout=300
    )
    logs = cluster.kubectl("logs", pod, "-n", ns).stdout
    assert "training exited 0" in logs, logs[-3000:]


COUNTS_JOB = "twice-preempted"


def _tp_status(cluster: LocalCluster, ns: str, job: str) -> dict:
    p = cluster.kubectl("get", "tp", job, "-n", ns, "-o", "json", check=False)
    return (json.loads(p.stdout).get("status") or {}) if p.returncode == 0 else {}


def _counted_by_process(cluster: LocalCluster, ns: str, job: str, incarnation: str | None) -> int:
    """The checkpoints the TrainingProgress holds for the process `incarnation` (None: any)."""
    life = _tp_status(cluster, ns, job).get("lifetime") or {}
    if incarnation is not None and life.get("incarnation") != incarnation:
        return 0
    return int(life.get("incarnationCheckpoints") or 0)


def _preempt_and_resume(cluster: LocalCluster, ns: str, pod: str) -> dict:
    """`kubectl delete pod` (the preStop saves just in time, exit 143, the operator recreates
    the pod); the new process's first record, once it resumed."""
    uid = json.loads(cluster.kubectl("get", "pod", pod, "-n", ns, "-o", "json").stdout)["metadata"][
        "uid"
    ]
    before = _record(cluster, ns, pod).get("incarnation")
    cluster.kubectl("delete", "pod", pod, "-n", ns, "--wait=false")
    wait_pod(cluster, ns, pod, lambda p: p["metadata"]["uid"] != uid and running(p), "new", 180)
    return wait_for(
        lambda: (
            (r := _record(cluster, ns, pod)).get("resumedFrom")
            and r.get("incarnation") != before
            and r
        ),
        "the resumed process's record",
        timeout=180,
    )


def test_counts_survive_two_preemptions(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path
) -> None:
    """Issue 29: a job preempted twice (three training processes, each counting its checkpoints
    from 0) shows in its TrainingProgress the checkpoints of its whole life, two resumes and two
    interruptions, no step lost (each stop saved just in time), and a time lost."""
    demo = load_demo()
    ns = node_ns
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    storage = tmp_path / "volume"
    job_dir = storage / "runs" / ns / COUNTS_JOB
    job_dir.mkdir(parents=True)
    for p in (storage, storage / "runs", job_dir.parent, job_dir):
        p.chmod(0o777)
    cluster.apply(demo.storage_objects(storage, ns))
    _job_inputs(cluster, ns)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(demo.demo_policy(20)))
    job = _single_job(demo, COUNTS_JOB, 3000, 0.05)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
    pod = f"{COUNTS_JOB}-master-0"
    wait_pod(cluster, ns, pod, running, "running", timeout=180)
    resumed: dict = {}
    for _ in range(2):
        # Preempted once the controller has read two periodic saves of this process.
        process = resumed.get("incarnation")
        wait_for(
            lambda p=process: _counted_by_process(cluster, ns, COUNTS_JOB, p) >= 2,
            "two checkpoints of this process in the TrainingProgress",
            timeout=180,
        )
        resumed = _preempt_and_resume(cluster, ns, pod)

    def counted() -> dict | None:
        st = _tp_status(cluster, ns, COUNTS_JOB)
        life = st.get("lifetime") or {}
        return st if life.get("incarnation") == resumed["incarnation"] else None

    st = wait_for(counted, "the third process in the TrainingProgress", timeout=180)
    life = st["lifetime"]
    assert (life["interruptions"], life["resumes"]) == (2, 2), life
    # The first two processes saved at least 2 checkpoints each (and one just in time, unless
    # the stop came at a step already saved).
    own = life["incarnationCheckpoints"]
    assert st["checkpointing"]["checkpointsCreated"] == life["checkpointsCreated"] >= own + 4, st
    assert life["stepsLost"] == 0, life  # each stop saved at the step it stopped at
    assert float(life["secondsLost"]) > 0, life  # the pods' recreation took time
    assert life["lastInterruption"]["resumedStep"] == int(resumed["resumedFrom"].split("-")[1])
    described = cluster.kubectl("describe", "tp", COUNTS_JOB, "-n", ns).stdout
    assert re.search(r"Interruptions:\s+2\n", described), described
    cluster.kubectl("delete", "pytorchjob", COUNTS_JOB, "-n", ns, "--wait=false")


def job_condition(cluster: LocalCluster, ns: str, job: str, type_: str) -> str | None:
    p = cluster.kubectl("get", "pytorchjob", job, "-n", ns, "-o", "json", check=False)
    if p.returncode != 0:
        return None
    conds = (json.loads(p.stdout).get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conds if c["type"] == type_), None)


WATCHED = "watched"


def test_prometheus_scrapes_the_reconciler_and_the_dashboard_answers(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path
) -> None:
    """A real Prometheus scrapes the in-cluster reconciler as the ServiceMonitor of
    config/prometheus says (discovery of the metrics Service's endpoints, HTTPS, the token of a
    ServiceAccount that the overlay's ClusterRoleBinding lets read /metrics), and every query of
    the Grafana dashboard answers for a training job with the job's own labels."""
    demo = load_demo()
    ns = node_ns
    _opted_in(cluster, demo, ns)
    cluster.kubectl(
        "apply", "-n", ns, "-f", "-", input=json.dumps(_single_job(demo, WATCHED, 3000, 0.1))
    )

    component = REPO / "config" / "components" / "prometheus"
    binding = component / "metrics_reader_binding.yaml"
    subject = yaml.safe_load(binding.read_text())["subjects"][0]
    cluster.kubectl("create", "namespace", subject["namespace"], check=False)
    cluster.kubectl("create", "serviceaccount", subject["name"], "-n", subject["namespace"])
    cluster.kubectl("apply", "-f", str(binding))
    token = tmp_path / "token"
    token.write_text(
        cluster.kubectl(
            "create", "token", subject["name"], "-n", subject["namespace"], "--duration=1h"
        ).stdout.strip()
    )
    monitor = yaml.safe_load((component / "servicemonitor.yaml").read_text())
    assert cluster.binaries is not None
    prom = Prometheus(cluster.binaries.require_prometheus(), tmp_path / "prometheus")
    try:
        prom.start(
            [scrape_config(monitor, kubeconfig=cluster.kubeconfig, token_file=token, interval="2s")]
        )
        service = "kubeckpt-reconciler-metrics"

        def both_replicas_up() -> bool:
            ups = prom.query(f'up{{job="{service}"}}')
            return len(ups) == 2 and all(u["value"][1] == "1" for u in ups)

        try:
            wait_for(both_replicas_up, "both reconciler replicas scraped", timeout=120)
        except TimeoutError as e:
            raise AssertionError(f"{e}: {prom.targets()}\n{prom.logs()}") from e

        sel = f'namespace="{ns}", job="{WATCHED}"'

        def step() -> float:
            got = prom.query(f"kubeckpt_training_step{{{sel}}}")
            return float(got[0]["value"][1]) if got else -1.0

        wait_for(lambda: step() >= 1, "the job's step in Prometheus", timeout=240)
        first = step()
        wait_for(lambda: step() > first, "the step to advance in Prometheus", timeout=60)
        # One series, from the leader, with the job's labels (honorLabels), not exported_*.
        (series,) = prom.query(f"kubeckpt_training_step{{{sel}}}")
        labels = series["metric"]
        assert "exported_job" not in labels and "exported_namespace" not in labels, labels
        lease = json.loads(
            cluster.kubectl(
                "get", "lease", "kubeckpt-reconciler", "-n", SYSTEM_NS, "-o", "json"
            ).stdout
        )
        assert lease["spec"]["holderIdentity"].split("_")[0] == labels["pod"], (lease, labels)

        wait_for(
            lambda: prom.query(f"kubeckpt_checkpoint_save_seconds{{{sel}}}"),
            "a checkpoint's save seconds in Prometheus",
            timeout=120,
        )
        for q in queries():
            promql = q.replace("$namespace", ns).replace("$job", WATCHED)
            got = prom.query(promql)
            if "== 1" in q or "failed_saves" in q:  # not stalled, nothing failed
                assert all(float(r["value"][1]) == 0 for r in got) or not got, (q, got)
            else:
                assert got, f"no data for the dashboard's {q!r}"
        for v in variable_queries():
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", v)
            assert m, v
            selector = m.group(1).replace("$namespace", ns)
            values = prom.api(f"label/{m.group(2)}/values", **{"match[]": selector})
            assert {"namespace": ns, "job": WATCHED}[m.group(2)] in values, (v, values)
    finally:
        prom.stop()
        cluster.kubectl("delete", "-f", str(binding), check=False)
        cluster.kubectl("delete", "namespace", subject["namespace"], "--wait=false", check=False)
