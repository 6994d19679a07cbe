"""`make demo`: kubeckpt on a local cluster with a real node, end to end, shown with kubectl.

1. The local cluster: etcd, kube-apiserver, controller-manager, scheduler, the Kubeflow
   training-operator, and a real node (containerd, runc, the CNI bridge, kubelet, kube-proxy,
   CoreDNS) whose images `make images` built without Docker.
2. The add-on installed as a user installs it: `kubectl apply -k config/local` (config/default
   with the local images): the webhook Deployment (2 replicas) and the leader-elected reconciler.
3. An opted-in namespace with a CheckpointPolicy (storage on a PVC bound to a local volume) and
   an unchanged PyTorchJob: master + worker, `bash -c "torchrun ..."`, DDP over the pod network.
4. Progress with `kubectl get tp -w` while it trains.
5. A preemption the way clusters do it: `kubectl drain` evicts the job's pods; the kubelet runs
   the injected preStop, both ranks agree on one step and save, the containers exit 0.
6. The operator recreates the pods; they resume at exactly that step and complete; then
   `kubectl describe`, the Events, a summary (steps lost, save time, stall, preemption to
   first resumed step) and PASS/FAIL (exit status 1 on FAIL).

--fast runs a shorter job; --reference also runs an uninterrupted copy of the job and checks that
the preempted run's final parameters are bitwise equal to it; --keep leaves the cluster up;
--kueue runs the scenario in which Kueue preempts the job for a higher-priority one
(hack/demo_kueue.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.local_webhook import ADDON_ONLY_LABEL
from localcluster.pods import get_pod, running, wait_pod

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "demo"
JOB = "tiny-mlp"
REFERENCE = "tiny-mlp-reference"
PODS = (f"{JOB}-master-0", f"{JOB}-worker-0")
RESUMED = re.compile(r"resumed from (checkpoint-(\d+)) at step (\d+)")
_print_lock = threading.Lock()
_said: list[str] = []


def say(msg: str = "") -> None:
    with _print_lock:
        _said.extend(msg.splitlines())
        print(msg, flush=True)


def step_title(msg: str) -> None:
    say(f"\n== {msg}")


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[bool, str]] = []

    def check(self, ok: object, what: str) -> bool:
        self.results.append((bool(ok), what))
        say(f"   [{'ok' if ok else 'FAILED'}] {what}")
        return bool(ok)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(ok for ok, _ in self.results)


def show(cluster: LocalCluster, *args: str, clip: int = 0, timeout: float = 60) -> str:
    """Run kubectl and print the command and its output (lines cut at `clip` characters)."""
    out = cluster.kubectl(*args, check=False, timeout=timeout)
    text = (out.stdout + (out.stderr if out.returncode else "")).rstrip()
    if clip:
        text = "\n".join(
            ln if len(ln) <= clip else f"{ln[:clip]}... ({len(ln) - clip} more)"
            for ln in text.splitlines()
        )
    say(f"\n$ kubectl {shlex.join(args)}\n{text}")
    return out.stdout


def apply_shown(cluster: LocalCluster, obj: dict, namespace: str = NAMESPACE) -> None:
    """`kubectl apply` of a manifest, printed as a here-document."""
    text = yaml.safe_dump(obj, sort_keys=False).rstrip()
    say(f"\n$ kubectl apply -n {namespace} -f - <<EOF\n{text}\nEOF")
    say(cluster.kubectl("apply", "-n", namespace, "-f", "-", input=text).stdout.rstrip())


def progress_file(cluster: LocalCluster, pod: str = PODS[0]) -> dict:
    """Rank 0's progress record, read as the reconciler reads it (`cat` through pods/exec)."""
    p = cluster.kubectl(
        "exec",
        pod,
        "-n",
        NAMESPACE,
        "-c",
        "pytorch",
        "--",
        "cat",
        "/var/run/kubeckpt/progress.json",
        check=False,
    )
    try:
        return json.loads(p.stdout) if p.returncode == 0 else {}
    except ValueError:
        return {}


def tp_status(cluster: LocalCluster, job: str = JOB) -> dict:
    p = cluster.kubectl("get", "tp", job, "-n", NAMESPACE, "-o", "json", check=False)
    return (json.loads(p.stdout).get("status") or {}) if p.returncode == 0 else {}


def job_events(cluster: LocalCluster, job: str = JOB) -> list[dict]:
    out = cluster.kubectl(
        "get",
        "events",
        "-n",
        NAMESPACE,
        "-o",
        "json",
        "--field-selector",
        f"involvedObject.name={job},involvedObject.kind=PyTorchJob",
    ).stdout
    return json.loads(out)["items"]


def condition(status: dict, type_: str) -> str | None:
    return next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == type_), None
    )


def job_condition(cluster: LocalCluster, job: str, type_: str) -> str | None:
    p = cluster.kubectl("get", "pytorchjob", job, "-n", NAMESPACE, "-o", "json", check=False)
    return condition(json.loads(p.stdout).get("status") or {}, type_) if p.returncode == 0 else None


def demo_policy(save_steps: int) -> dict:
    """config/samples' CheckpointPolicy, with what this demo changes (printed by the caller)."""
    sample = REPO / "config" / "samples" / "kubeckpt.io_v1alpha1_checkpointpolicy.yaml"
    policy = yaml.safe_load(sample.read_text())
    spec = policy["spec"]
    spec.pop("selector", None)  # every training pod of the namespace
    spec["storage"] = {"uri": "pvc://checkpoints/runs", "mountPath": "/mnt/kubeckpt"}
    spec["strategy"], spec["saveSteps"] = "steps", save_steps
    spec["localTier"] = {"enabled": False}
    spec["progress"] = {"updateEverySteps": 5}
    return policy


def storage_objects(storage: Path, namespace: str = NAMESPACE) -> list[dict]:
    """A local PersistentVolume on the node (a directory of this host) and its claim in
    `namespace` (the tests use their own)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-checkpoints"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "local",
                "claimRef": {"namespace": namespace, "name": "checkpoints"},
                "hostPath": {"path": str(storage), "type": "Directory"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "checkpoints", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "local",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


def demo_job(name: str, steps: int, step_seconds: float, *, tolerate: bool) -> dict:
    job = yaml.safe_load((REPO / "hack" / "demo" / "pytorchjob.yaml").read_text())
    job["metadata"]["name"] = name
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        c = pod["containers"][0]
        c["command"][-1] = re.sub(
            r"--steps=\d+ --step-seconds=[\d.]+",
            f"--steps={steps} --step-seconds={step_seconds}",
            c["command"][-1],
        )
        if tolerate:  # the test session's real node is tainted (see localcluster.addon)
            kubeckpt_addon.real_node_placement(pod)
    return job


class Watch:
    """`kubectl get tp -w` in the background, its lines printed as they come."""

    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.binaries is not None
        argv = [str(cluster.binaries.kubectl), "--kubeconfig", str(cluster.kubeconfig)]
        self.proc = subprocess.Popen(
            [*argv, "get", "tp", "-n", NAMESPACE, "-w"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            say(f"   tp -w | {line.rstrip()}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(5)


def show_injection(cluster: LocalCluster, checks: Checks, pod_name: str) -> dict:
    pod = get_pod(cluster, NAMESPACE, pod_name)
    assert pod is not None
    get = ("get", "pod", pod_name, "-n", NAMESPACE, "-o")
    show(cluster, *get, "jsonpath={.metadata.annotations.kubeckpt\\.io/status}", clip=160)
    env_q = '{range .spec.containers[0].env[*]}{.name}={.value}{.valueFrom}{"\\n"}{end}'
    show(cluster, *get, f"jsonpath={env_q}", clip=160)
    show(
        cluster,
        *get,
        'jsonpath=preStop={.spec.containers[0].lifecycle.preStop.exec.command}{"\\n"}'
        'terminationGracePeriodSeconds={.spec.terminationGracePeriodSeconds}{"\\n"}'
        "volumeMounts={.spec.containers[0].volumeMounts}",
        clip=160,
    )
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env") or []}
    checks.check(
        pod["metadata"].get("labels", {}).get("kubeckpt.io/injected") == "true"
        and {"TRAINING_PROGRESS_FILE", "CHECKPOINT_URI", "CHECKPOINT_JIT", "HF_TOKEN"} <= env
        and bool(pod["spec"]["containers"][0].get("lifecycle", {}).get("preStop")),
        f"the in-cluster webhook injected {pod_name}: env (the user's HF_TOKEN kept), preStop, "
        f"grace {pod['spec'].get('terminationGracePeriodSeconds')} s",
    )
    return pod


def logs(cluster: LocalCluster, pod: str) -> str:
    return cluster.kubectl("logs", pod, "-n", NAMESPACE, check=False).stdout


def install_and_prepare(
    cluster: LocalCluster,
    checks: Checks,
    work: Path,
    save_steps: int,
    *,
    own: bool,
    jobs: tuple[str, ...] = (JOB, REFERENCE),
) -> Path:
    """The add-on installed from config/local, and the opted-in namespace: a CheckpointPolicy, a
    PVC on a host directory (returned), the HF-token-style Secret, the script's ConfigMap."""
    step_title("installing the add-on as a user would: kubectl apply -k config/local")
    say(f"\n$ kubectl apply -k config/local\n{kubeckpt_addon.install(cluster).rstrip()}")
    show(cluster, "get", "deployments,pods", "-n", kubeckpt_addon.SYSTEM_NS, "-o", "wide")
    show(cluster, "get", "lease", "kubeckpt-reconciler", "-n", kubeckpt_addon.SYSTEM_NS)
    checks.check(True, "webhook (2 replicas) and reconciler (2, leader-elected) rolled out")

    step_title(f"an opted-in namespace {NAMESPACE!r}: a CheckpointPolicy, a PVC, a Secret")
    # An earlier run's namespace (and its PV) may still be going (pods in their grace period).
    wait_for(
        lambda: (
            cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0
            and cluster.kubectl("get", "pv", f"{NAMESPACE}-checkpoints", check=False).returncode
            != 0
        ),
        f"an earlier {NAMESPACE!r} namespace and its volume to go",
        timeout=300,
    )
    cluster.kubectl("create", "namespace", NAMESPACE)
    if not own:  # the test session's cluster: keep its local test webhook out of the demo
        cluster.kubectl("label", "namespace", NAMESPACE, f"{ADDON_ONLY_LABEL}=true")
    show(cluster, "label", "namespace", NAMESPACE, "kubeckpt.io/inject=enabled")
    storage = work / "volume"
    # The per-job directories the webhook's subPath names (the kubelet would create them
    # root-owned; the training image runs as uid 1000).
    for job in jobs:
        d = storage / "runs" / NAMESPACE / job
        d.mkdir(parents=True)
        for p in (storage, storage / "runs", d.parent, d):
            p.chmod(0o777)
    cluster.apply(storage_objects(storage))
    cluster.kubectl(
        "create",
        "secret",
        "generic",
        "hf-token",
        "-n",
        NAMESPACE,
        "--from-literal=token=hf_demo_not_a_real_token",
    )
    cluster.kubectl(
        "create",
        "configmap",
        "train",
        "-n",
        NAMESPACE,
        f"--from-file=train.py={REPO / 'hack' / 'demo' / 'train.py'}",
    )
    say(
        "   config/samples' policy, changed: no selector, storage pvc://checkpoints/runs, "
        f"a checkpoint every {save_steps} steps, no local tier"
    )
    apply_shown(cluster, demo_policy(save_steps))
    show(cluster, "get", "ckptpol,pvc,secret,configmap", "-n", NAMESPACE)

    return storage


def follow_until_half(
    cluster: LocalCluster, checks: Checks, steps: int, step_seconds: float
) -> None:
    """`kubectl get tp -w` while the job trains past a periodic checkpoint and half its steps."""
    step_title("progress with plain kubectl while it trains: kubectl get tp -n demo -w")
    watch = Watch(cluster)
    try:
        # The reconciler polls every 15-30 s; the moment to preempt is taken from the progress
        # file itself (what it reads), through the same exec.
        wait_for(
            lambda: (progress_file(cluster).get("checkpointing") or {}).get("latestCheckpoint"),
            "a periodic checkpoint",
            timeout=steps * step_seconds * 3 + 120,
        )
        wait_for(
            lambda: (progress_file(cluster).get("step") or 0) >= steps // 2,
            f"step {steps // 2}",
            timeout=steps * step_seconds * 3 + 120,
        )
    finally:
        watch.stop()
    checks.check(
        any(re.search(rf"tp -w \| {JOB}\s+{JOB}\s+Training\s+\d+", ln) for ln in _said),
        "kubectl get tp -w followed the job",
    )


def report(cluster: LocalCluster, checks: Checks, t_start: float, *, keep: bool) -> int:
    """Every check, PASS or FAIL, and the exit status; with `keep`, the cluster stays up until
    Ctrl-C."""
    wall = time.monotonic() - t_start
    for ok, what in checks.results:
        say(f"   {'PASS' if ok else 'FAIL'}  {what}")
    say(f"\n{'PASS' if checks.passed else 'FAIL'}: kubeckpt demo in {wall:.0f} s")
    if keep:
        say(f"\nexport KUBECONFIG={cluster.kubeconfig}   (Ctrl-C stops the cluster)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0 if checks.passed else 1


def check_resumed(
    cluster: LocalCluster,
    checks: Checks,
    first: dict[str, dict],
    before: int,
    storage: Path,
    t_preempt: float,
    title: str = "the operator recreates the pods; they resume",
) -> tuple[int, float]:
    """After a preemption: the job's pods come back (new UIDs), both ranks resume at exactly one
    step, no earlier than `before`, from a complete checkpoint on the volume. Returns that step
    and the seconds from `t_preempt` to the resumed run's first step."""
    step_title(title)
    uids = {p: first[p]["metadata"]["uid"] for p in PODS}
    for p in PODS:
        wait_pod(
            cluster,
            NAMESPACE,
            p,
            lambda pod, p=p: pod["metadata"]["uid"] != uids[p] and running(pod),
            "recreated and running",
            timeout=180,
        )
    resumed = {
        p: wait_for(
            lambda p=p: re.search(
                r"resumed from (checkpoint-(\d+)) at step (\d+)", logs(cluster, p)
            ),
            f"{p} to restore",
            timeout=120,
        )
        for p in PODS
    }
    t_resumed = time.monotonic() - t_preempt
    jit = {p: int(m.group(3)) for p, m in resumed.items()}
    jit_step = jit[PODS[0]]
    show(cluster, "get", "pods", "-n", NAMESPACE)
    checks.check(
        len(set(jit.values())) == 1 and all(m.group(2) == m.group(3) for m in resumed.values()),
        f"both ranks resumed at exactly one step: {jit}",
    )
    checks.check(jit_step >= before, f"no step lost: saved at {jit_step} >= {before}")
    ckpt = storage / "runs" / NAMESPACE / JOB / f"checkpoint-{jit_step}"
    checks.check(
        (ckpt / "manifest.json").is_file(),
        f"the just-in-time checkpoint is complete on the volume: .../{JOB}/{ckpt.name}",
    )
    return jit_step, t_resumed


def check_finished(
    cluster: LocalCluster, checks: Checks, steps: int, step_seconds: float, *, reference: bool
) -> None:
    """The job succeeds at its last step on both ranks; with `reference`, its final parameters
    equal the uninterrupted copy's, bit for bit."""
    step_title("training runs to the end")
    wait_for(
        lambda: job_condition(cluster, JOB, "Succeeded") == "True",
        "the PyTorchJob to succeed",
        timeout=steps * step_seconds * 4 + 180,
    )
    finals = {p: logs(cluster, p) for p in PODS}
    for p, text in finals.items():
        say(f"\n$ kubectl logs {p} -n {NAMESPACE} | tail -3")
        say("\n".join(text.rstrip().splitlines()[-3:]))
    checks.check(
        all(f"finished at step {steps}" in t for t in finals.values()),
        f"both ranks finished at step {steps}",
    )
    digest = re.search(r"final parameters sha256 (\w+)", finals[PODS[0]])
    if reference:
        wait_for(
            lambda: job_condition(cluster, REFERENCE, "Succeeded") == "True",
            "the reference job to succeed",
            timeout=steps * step_seconds * 4 + 180,
        )
        ref = re.search(r"final parameters sha256 (\w+)", logs(cluster, f"{REFERENCE}-master-0"))
        checks.check(
            digest and ref and digest.group(1) == ref.group(1),
            "final parameters bitwise equal to the uninterrupted run's "
            f"(sha256 {digest.group(1)[:16] if digest else None}...)",
        )


def check_end_state(cluster: LocalCluster, checks: Checks, steps: int) -> dict:
    """The TrainingProgress Completed at the last step, from the termination message; the
    JITCheckpoint and Resumed Events once each, shown by `kubectl describe tp`. Returns it."""

    def completed() -> dict | None:
        st = tp_status(cluster)
        return st if condition(st, "Completed") == "True" and st.get("step") == steps else None

    st = wait_for(completed, "the TrainingProgress to be Completed", timeout=90)
    reasons = [e["reason"] for e in job_events(cluster) for _ in range(e.get("count") or 1)]
    checks.check(
        reasons.count("JITCheckpoint") == 1 and reasons.count("Resumed") == 1,
        f"Events JITCheckpoint x{reasons.count('JITCheckpoint')}, "
        f"Resumed x{reasons.count('Resumed')} (once each)",
    )
    checks.check(
        st.get("source") == "terminationMessage",
        f"the final status read from the {st.get('source')}",
    )

    step_title("the end state")
    show(cluster, "get", "pytorchjob,tp", "-n", NAMESPACE)
    described = show(cluster, "describe", "tp", JOB, "-n", NAMESPACE)
    events = described[described.find("Events:") :]
    checks.check(
        "JITCheckpoint" in events and "Resumed" in events,
        "kubectl describe tp lists the JITCheckpoint and Resumed Events",
    )
    return st


def run(args: argparse.Namespace, work: Path, cluster: LocalCluster | None = None) -> int:
    """The demo; on `cluster` if given (the tests' session cluster), else on one of its own."""
    checks = Checks()
    t_start = time.monotonic()
    steps, step_seconds = (400, 0.1) if args.fast else (600, 0.15)
    save_steps = steps // 4
    own = cluster is None
    if cluster is None:
        step_title(
            "starting the local cluster: control plane, training-operator, and a real node "
            "(containerd, runc, CNI bridge, kubelet, kube-proxy, CoreDNS)"
        )
        cluster = LocalCluster(nodes=0, real_nodes=1)
        cluster.start()
        say(f"   ready in {cluster.timings['start']:.1f} s; KUBECONFIG={cluster.kubeconfig}")
    node = cluster.start_real_node()
    try:
        show(cluster, "get", "nodes", "-o", "wide")

        storage = install_and_prepare(cluster, checks, work, save_steps, own=own)

        step_title("an unchanged PyTorchJob (hack/demo/pytorchjob.yaml): nothing of kubeckpt in it")
        apply_shown(cluster, demo_job(JOB, steps, step_seconds, tolerate=node.taint))
        if args.reference:
            say("   and an uninterrupted copy, to compare the final parameters with:")
            apply_shown(cluster, demo_job(REFERENCE, steps, step_seconds, tolerate=node.taint))
        first = {p: wait_pod(cluster, NAMESPACE, p, running, "running", timeout=180) for p in PODS}
        show(cluster, "get", "pytorchjob,pods", "-n", NAMESPACE, "-o", "wide")

        step_title("what the webhook injected into the operator's pods")
        for p in PODS:
            show_injection(cluster, checks, p)

        follow_until_half(cluster, checks, steps, step_seconds)
        show(cluster, "describe", "tp", JOB, "-n", NAMESPACE)

        step_title(f"preemption: kubectl drain evicts the job's pods from {node.name}")
        before = int(progress_file(cluster).get("step") or 0)
        t_preempt = time.monotonic()
        show(
            cluster,
            "drain",
            node.name,
            "--pod-selector",
            f"training.kubeflow.org/job-name={JOB}",
            "--delete-emptydir-data",
            "--ignore-daemonsets",
            "--timeout=300s",
            timeout=320,
        )
        drained = time.monotonic() - t_preempt
        show(cluster, "uncordon", node.name)
        say(f"   both pods gone {drained:.1f} s after the eviction (step {before} just before it)")

        jit_step, t_resumed = check_resumed(cluster, checks, first, before, storage, t_preempt)

        check_finished(cluster, checks, steps, step_seconds, reference=args.reference)
        st = check_end_state(cluster, checks, steps)

        step_title("summary")
        ck = st.get("checkpointing") or {}
        say(
            f"   steps lost: {max(0, before - jit_step)} (step {before} just before the drain; "
            f"both ranks saved step {jit_step} and resumed there)\n"
            f"   last save {ck.get('lastSaveSeconds')} s, stall {ck.get('lastStallSeconds')} s "
            f"(the job's last checkpoint)\n"
            f"   preemption to pods gone: {drained:.1f} s; to the first resumed step: "
            f"{t_resumed:.1f} s"
        )
        return report(cluster, checks, t_start, keep=args.keep and own)
    except Exception as e:
        return failed(cluster, e, "pods,tp,events")
    finally:
        if own:
            stop_cluster(cluster)
        else:
            remove_demo(cluster)


def failed(cluster: LocalCluster, e: Exception, resources: str) -> int:
    """A run that raised: the error, the namespace's `resources` and the job's logs; status 1."""
    say(f"\nFAIL: {type(e).__name__}: {e}")
    show(cluster, "get", resources, "-n", NAMESPACE, "-o", "wide")
    for p in PODS:
        say(f"--- logs {p} ---\n{logs(cluster, p)[-3000:]}")
    return 1


def stop_cluster(cluster: LocalCluster) -> None:
    cluster.stop()
    say("\n== cluster stopped: processes, containers, mounts, network and iptables rules")


def remove_demo(cluster: LocalCluster) -> None:
    """The demo's namespace and volume, off a cluster the demo did not start (the tests')."""
    cluster.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s", check=False, timeout=150)
    # Not waited for: the PV's protection finalizer goes with the claim, once the namespace is.
    cluster.kubectl("delete", "pv", f"{NAMESPACE}-checkpoints", "--wait=false", check=False)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keep", action="store_true", help="keep the cluster until Ctrl-C")
    ap.add_argument("--fast", action="store_true", help="a shorter job")
    ap.add_argument(
        "--reference", action="store_true", help="compare with an uninterrupted run, bitwise"
    )
    ap.add_argument(
        "--kueue", action="store_true", help="Kueue preempts the job (hack/demo_kueue.py)"
    )
    args = ap.parse_args()
    scenario = run
    if args.kueue:
        import demo_kueue  # imports this module as `demo` (see the end of the file)

        scenario = demo_kueue.run

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C

    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="kubeckpt-demo-") as tmp:
        try:
            return scenario(args, Path(tmp))
        except KeyboardInterrupt:
            say("\ninterrupted")
            return 130


if __name__ == "__main__":
    # demo_kueue imports its shared steps from `demo`: this module, not a second copy of it.
    sys.modules.setdefault("demo", sys.modules[__name__])
    sys.exit(main())
