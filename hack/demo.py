"""`make demo`: kubeckpt's main job, end to end, on a local control plane, shown with kubectl.

1. The local control plane (etcd, kube-apiserver, controller-manager, scheduler, KWOK nodes, the
   real Kubeflow training-operator) and the add-on: our CRDs, a CheckpointPolicy in an opted-in
   namespace, `kubeckpt-webhook` (registered by URL, its own CA in the caBundle) and
   `kubeckpt-reconciler` (leader-elected), both as local processes.
2. An unchanged PyTorchJob; the operator creates its pod; the webhook injects it.
3. A real training run: the demo plays the kubelet (KWOK runs no containers) and runs the pod's
   training script on this host with the env the webhook injected (see hack/demo_support.py).
4. Progress with plain `kubectl get tp` while it trains.
5. A preemption: `kubectl delete pod`; preStop and SIGTERM; a just-in-time checkpoint; the operator
   recreates the pod, the webhook injects it again, and training resumes at exactly that step.
6. The end state, the reconciler's Events on the job, and PASS/FAIL (exit status 1 on FAIL).

--fast runs a shorter job (for the test); --keep leaves the cluster up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import demo_support as ds
import yaml

from localcluster import LocalCluster, stop_process, wait_for

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "demo"
JOB = "tiny-mlp"
MASTER = f"{JOB}-master-0"
_print_lock = threading.Lock()


def say(msg: str = "") -> None:
    with _print_lock:
        print(msg, flush=True)


def step_title(msg: str) -> None:
    say(f"\n== {msg}")


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[bool, str]] = []

    def check(self, ok: bool, what: str) -> bool:
        self.results.append((bool(ok), what))
        say(f"   [{'ok' if ok else 'FAILED'}] {what}")
        return bool(ok)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(ok for ok, _ in self.results)


def show(cluster: LocalCluster, *args: str, clip: int = 0) -> str:
    """Run kubectl and print the command and its output (lines cut at `clip` characters)."""
    out = cluster.kubectl(*args, check=False)
    text = (out.stdout + (out.stderr if out.returncode else "")).rstrip()
    if clip:
        text = "\n".join(
            ln if len(ln) <= clip else f"{ln[:clip]}... ({len(ln) - clip} more)"
            for ln in text.splitlines()
        )
    say(f"\n$ kubectl {shlex.join(args)}\n{text}")
    return out.stdout


def apply_shown(cluster: LocalCluster, obj: dict) -> None:
    """`kubectl apply` of a manifest, printed as a here-document."""
    text = yaml.safe_dump(obj, sort_keys=False).rstrip()
    say(f"\n$ kubectl apply -n {NAMESPACE} -f - <<EOF\n{text}\nEOF")
    say(cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=text).stdout.rstrip())


def demo_policy(storage: Path, save_steps: int) -> dict:
    """config/samples' CheckpointPolicy, with what this demo changes (printed by the caller)."""
    sample = REPO / "config" / "samples" / "kubeckpt.io_v1alpha1_checkpointpolicy.yaml"
    policy = yaml.safe_load(sample.read_text())
    spec = policy["spec"]
    spec.pop("selector", None)  # every training pod of the namespace
    spec["storage"] = {"uri": f"file://{storage}"}  # no PVC on KWOK: a directory of this host
    spec["strategy"], spec["saveSteps"] = "steps", save_steps
    spec["localTier"] = {"enabled": False}  # no ramdisk on this host
    return policy


def tp_status(cluster: LocalCluster) -> dict:
    p = cluster.kubectl("get", "tp", JOB, "-n", NAMESPACE, "-o", "json", check=False)
    return (json.loads(p.stdout).get("status") or {}) if p.returncode == 0 else {}


def job_events(cluster: LocalCluster) -> list[dict]:
    out = cluster.kubectl(
        "get",
        "events",
        "-n",
        NAMESPACE,
        "-o",
        "json",
        "--field-selector",
        f"involvedObject.name={JOB},involvedObject.kind=PyTorchJob",
    ).stdout
    return json.loads(out)["items"]


def event_reasons(cluster: LocalCluster) -> set[str]:
    return {e["reason"] for e in job_events(cluster)}


def condition(status: dict, type_: str) -> str | None:
    return next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == type_), None
    )


def running_pod(cluster: LocalCluster, not_uid: str | None = None) -> dict | None:
    pod = ds.pod_json(cluster, NAMESPACE, MASTER)
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return None
    if not_uid and pod["metadata"]["uid"] == not_uid:
        return None
    return pod if pod.get("status", {}).get("phase") == "Running" else None


def show_injection(cluster: LocalCluster, checks: Checks, *, full: bool = True) -> dict:
    pod = ds.pod_json(cluster, NAMESPACE, MASTER)
    assert pod is not None
    q = (
        '{.metadata.labels.kubeckpt\\.io/injected}{"  "}'
        "{.metadata.annotations.kubeckpt\\.io/status}"
    )
    get = ("get", "pod", MASTER, "-n", NAMESPACE, "-o")
    show(cluster, *get, f"jsonpath={q}")
    if full:
        env_q = '{range .spec.containers[0].env[*]}{.name}={.value}{.valueFrom}{"\\n"}{end}'
        show(cluster, *get, f"jsonpath={env_q}")
        show(
            cluster,
            *get,
            'jsonpath=preStop={.spec.containers[0].lifecycle.preStop.exec.command}{"\\n"}'
            "volumeMounts={.spec.containers[0].volumeMounts}",
        )
    show(
        cluster,
        *get,
        "jsonpath=terminationGracePeriodSeconds={.spec.terminationGracePeriodSeconds}",
    )
    if not full:
        say("   (the grace period is now sized from the save time the job measured)")
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env") or []}
    checks.check(
        pod["metadata"].get("labels", {}).get("kubeckpt.io/injected") == "true"
        and {"TRAINING_PROGRESS_FILE", "CHECKPOINT_URI", "CHECKPOINT_JIT"} <= env
        and bool(pod["spec"]["containers"][0].get("lifecycle", {}).get("preStop"))
        and bool(pod["spec"].get("terminationGracePeriodSeconds")),
        f"webhook injected pod {MASTER} (uid {pod['metadata']['uid'][:8]}): env, preStop, grace "
        f"{pod['spec'].get('terminationGracePeriodSeconds')} s",
    )
    return pod


def run(args: argparse.Namespace, work: Path) -> int:
    checks = Checks()
    t_start = time.monotonic()
    steps, step_seconds = (200, 0.06) if args.fast else (300, 0.1)
    save_steps = steps // 6
    logs = work / "logs"
    logs.mkdir()
    storage = work / "checkpoints"
    storage.mkdir()
    shim_dir = ds.write_cat_shim(work / "bin")
    pods: list[ds.PodProcess] = []
    procs: list[Any] = []

    step_title(
        "starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, "
        "KWOK, training-operator)"
    )
    cluster = LocalCluster(nodes=3)
    # The pod's `cat` for exec'd commands (see demo_support): KWOK inherits this PATH.
    with _prepended_path(shim_dir):
        cluster.start()
    try:
        say(f"   ready in {cluster.timings['start']:.1f} s; KUBECONFIG={cluster.kubeconfig}")
        show(cluster, "get", "nodes")
        show(cluster, "api-resources", "--api-group=kubeckpt.io")

        step_title("installing the add-on: webhook and reconciler as local processes")
        cluster.kubectl("create", "namespace", ds.ADDON_NS)
        webhook, port = ds.start_webhook(cluster, logs)
        procs.append(webhook)
        say(f"   kubeckpt-webhook serving https://127.0.0.1:{port}/mutate (pid {webhook.pid})")
        reconciler, rport = ds.start_reconciler(cluster, logs)
        procs.append(reconciler)
        say(f"   kubeckpt-reconciler running (pid {reconciler.pid}, metrics :{rport})")
        show(
            cluster,
            "get",
            "mutatingwebhookconfiguration",
            ds.MWC_NAME,
            "-o",
            "jsonpath={range .webhooks[*]}{.name}  url={.clientConfig.url}  "
            'caBundle={.clientConfig.caBundle}{"\\n"}{end}',
            clip=140,
        )
        show(cluster, "get", "lease", "kubeckpt-reconciler", "-n", ds.ADDON_NS)
        checks.check(True, "webhook ready with its caBundle published; reconciler holds the Lease")

        step_title(f"an opted-in namespace {NAMESPACE!r} with a CheckpointPolicy")
        cluster.kubectl("create", "namespace", NAMESPACE)
        show(cluster, "label", "namespace", NAMESPACE, "kubeckpt.io/inject=enabled")
        policy = demo_policy(storage, save_steps)
        say(
            "   config/samples' policy, changed: no selector, storage file://<demo dir>, "
            f"strategy steps every {save_steps}, no local tier"
        )
        apply_shown(cluster, policy)
        show(cluster, "get", "ckptpol", "-n", NAMESPACE)
        _wait_policy_seen(cluster)

        step_title("an unchanged PyTorchJob (hack/demo/pytorchjob.yaml): nothing of kubeckpt in it")
        job = yaml.safe_load((REPO / "hack" / "demo" / "pytorchjob.yaml").read_text())
        command = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        command["command"] = [
            "python",
            "/workspace/train.py",
            f"--steps={steps}",
            f"--step-seconds={step_seconds}",
        ]
        apply_shown(cluster, job)
        pod = wait_for(lambda: running_pod(cluster), "the master pod to run", timeout=90)
        show(cluster, "get", "pytorchjob,pods", "-n", NAMESPACE, "-o", "wide")

        step_title("what the webhook injected into the operator's pod")
        pod = show_injection(cluster, checks)

        step_title(
            "training: the demo plays the kubelet and runs the container's script on this host"
        )
        first = _start(cluster, pod, logs, pods)
        say(
            f"   pod root {first.root} (KWOK Exec workDir; /var/run/kubeckpt lives under it)\n"
            f"   CHECKPOINT_URI={first.env.get('CHECKPOINT_URI')}"
        )

        step_title("progress with plain kubectl while it trains")
        wait_for(
            lambda: (tp_status(cluster).get("step") or 0) >= 1,
            "the first progress in the TrainingProgress",
            timeout=90,
        )
        seen: list[int] = [0]
        for fraction in (0.1, 0.25, 0.4):
            # A later step than the last one shown, and at least this far along.
            need = max(seen[-1] + 1, int(fraction * steps))
            wait_for(
                lambda n=need: (tp_status(cluster).get("step") or 0) >= n,
                f"step {need} in the TrainingProgress",
                timeout=120,
            )
            table = show(cluster, "get", "tp", "-n", NAMESPACE)
            seen.append(int(table.splitlines()[-1].split()[2]))
        seen = seen[1:]
        checks.check(
            len(set(seen)) == 3 and seen == sorted(seen),
            f"kubectl get tp follows the steps: {seen}",
        )
        wait_for(
            lambda: (tp_status(cluster).get("checkpointing") or {}).get("latestCheckpoint"),
            "a periodic checkpoint",
            timeout=60,
        )
        show(cluster, "describe", "tp", JOB, "-n", NAMESPACE)

        step_title("preemption: the master pod is deleted gracefully")
        wait_for(
            lambda: (tp_status(cluster).get("step") or 0) >= steps // 2,
            f"step {steps // 2}",
            timeout=120,
        )
        preempt_step = int(tp_status(cluster).get("step") or 0)
        show(cluster, "delete", "pod", MASTER, "-n", NAMESPACE, "--wait=false")
        jit_step = _kubelet_terminate(cluster, first, checks)["step"]
        show(cluster, "get", "tp", "-n", NAMESPACE)
        say(f"   (the last poll before the delete saw step {preempt_step})")

        step_title("the operator recreates the pod; the webhook injects it again")
        pod = wait_for(
            lambda: running_pod(cluster, not_uid=first.uid), "the new master pod", timeout=90
        )
        show(cluster, "get", "pods", "-n", NAMESPACE)
        show_injection(cluster, checks, full=False)
        second = _start(cluster, pod, logs, pods)
        resumed = wait_for(
            lambda: (
                next((ln for ln in second.lines if ln.startswith("train: ")), None)
                or (not second.alive() and "exited")
            ),
            "the new process to restore",
            timeout=120,
        )
        checks.check(
            resumed == f"train: resumed from checkpoint-{jit_step} at step {jit_step}",
            f"resumed at exactly the just-in-time step {jit_step}: {resumed!r}",
        )
        wait_for(
            lambda: tp_status(cluster).get("resumedFrom") == f"checkpoint-{jit_step}",
            "the TrainingProgress to show the resume",
            timeout=60,
        )
        show(cluster, "get", "tp", "-n", NAMESPACE)

        step_title("training runs to the end")
        rc = second.wait(steps * step_seconds * 3 + 120)
        info = second.exit_info()
        checks.check(
            rc == 0 and info.get("step") == steps and not info.get("stopped"),
            f"the second run finished: exit {rc}, step {info.get('step')} of {steps}",
        )
        second.report_exit(rc, phase="Succeeded" if rc == 0 else "Failed")
        second.release()

        def finished() -> bool:
            st = tp_status(cluster)
            return condition(st, "Completed") == "True" and st.get("step") == steps

        wait_for(finished, "the TrainingProgress to be Completed", timeout=60)
        job_done = wait_for(
            lambda: (
                condition(
                    json.loads(
                        cluster.kubectl(
                            "get", "pytorchjob", JOB, "-n", NAMESPACE, "-o", "json"
                        ).stdout
                    ).get("status")
                    or {},
                    "Succeeded",
                )
                == "True"
            ),
            "the PyTorchJob to succeed",
            timeout=60,
        )
        checks.check(bool(job_done), "the operator marked the PyTorchJob Succeeded")

        step_title("the end state")
        show(cluster, "get", "pytorchjob,tp", "-n", NAMESPACE)
        show(cluster, "describe", "pytorchjob", JOB, "-n", NAMESPACE)
        want = {"CheckpointSaved", "JITCheckpoint", "Resumed", "Completed"}
        got = event_reasons(cluster)
        ours = sorted(got & (want | {"Stalled"}))
        checks.check(want <= got, f"the reconciler's Events on the job: {ours}")
        st = tp_status(cluster)
        checks.check(
            st.get("step") == steps and st.get("source") == "terminationMessage",
            f"TrainingProgress: step {st.get('step')} of {steps}, Completed, "
            f"from the {st.get('source')}",
        )

        step_title("summary")
        wall = time.monotonic() - t_start
        for ok, what in checks.results:
            say(f"   {'PASS' if ok else 'FAIL'}  {what}")
        say(f"\n{'PASS' if checks.passed else 'FAIL'}: kubeckpt demo in {wall:.0f} s")
        if args.keep:
            say(
                f"\nexport KUBECONFIG={cluster.kubeconfig}   (kubectl: {cluster.binaries.kubectl}"
                f"; Ctrl-C stops the cluster)"
            )
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0 if checks.passed else 1
    except Exception as e:
        say(f"\nFAIL: {type(e).__name__}: {e}")
        for name in ("kubeckpt-webhook", "kubeckpt-reconciler"):
            say(f"--- {name} log (tail) ---\n{ds.tail(logs / f'{name}.log', 6000)}")
        show(cluster, "get", "pods,tp", "-n", NAMESPACE, "-o", "yaml")
        return 1
    finally:
        for p in pods:
            p.stop()
        for proc in reversed(procs):
            stop_process(proc)
        cluster.stop()
        say("\n== cluster stopped; the webhook, reconciler and training processes ended")


class _prepended_path:
    """PATH with one more directory first, for the processes started inside the block."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.old: str | None = None

    def __enter__(self) -> None:
        self.old = os.environ.get("PATH", "")
        os.environ["PATH"] = f"{self.directory}:{self.old}"

    def __exit__(self, *exc: object) -> None:
        os.environ["PATH"] = self.old or ""


def _wait_policy_seen(cluster: LocalCluster) -> None:
    """The webhook fails open: wait until its cache has the policy before the job's pods come."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "probe",
            "namespace": NAMESPACE,
            "labels": {"training.kubeflow.org/job-name": "probe"},
        },
        "spec": {"containers": [{"name": "pytorch", "image": "busybox"}]},
    }

    def injected() -> bool:
        out = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(probe)
        ).stdout
        return "kubeckpt.io/injected" in json.loads(out)["metadata"].get("labels", {})

    wait_for(injected, "the webhook's cache to hold the policy", timeout=30)


def _start(cluster: LocalCluster, pod: dict, logs: Path, pods: list[ds.PodProcess]) -> Any:
    argv = pod["spec"]["containers"][0]["command"]
    # The container's `python /workspace/train.py ARGS`: this venv's python, the repo's script.
    local = [sys.executable, str(REPO / "hack" / "demo" / "train.py"), *argv[2:]]
    p = ds.PodProcess(cluster, pod, local, logs, say)
    p.start()
    pods.append(p)
    say(f"   kubelet: started {shlex.join(local[1:])} for pod {MASTER} (pid {p.proc.pid})")
    return p


def _kubelet_terminate(cluster: LocalCluster, p: ds.PodProcess, checks: Checks) -> dict:
    """The kubelet's side of the delete: preStop, SIGTERM, the exit reported, the pod released."""
    wait_for(
        lambda: (
            (ds.pod_json(cluster, NAMESPACE, MASTER) or {})
            .get("metadata", {})
            .get("deletionTimestamp")
        ),
        "the pod's deletionTimestamp",
        timeout=30,
    )
    say(f"   kubelet: pod {MASTER} is terminating: preStop hook, then SIGTERM")
    t0 = time.monotonic()
    out = p.kill_sequence()
    p.report_exit(out["rc"])  # at once, as the kubelet does when the container has exited
    info = p.exit_info()
    message = p.termination_message()
    say(
        f"   kubelet: preStop exit {out.get('prestop_rc')} after "
        f"{out.get('prestop_seconds', 0):.1f} s; then SIGTERM; container exit {out['rc']} after "
        f"{time.monotonic() - t0:.1f} s (grace {out['grace']} s); termination message "
        f"{len(message)} bytes"
    )
    # The step it stopped at: what the process said, else its exit file.
    said = next((ln for ln in p.lines if ln.startswith("train: stopped at step ")), "")
    step = int(info.get("step") or (said.split()[4] if said else -1))
    ckpt = Path(p.env.get("CHECKPOINT_URI", "")) / f"checkpoint-{step}"
    complete = (ckpt / "manifest.json").is_file() and not (
        ckpt / "checkpoint-is-incomplete.txt"
    ).exists()
    checks.check(
        bool(said) and complete and out.get("prestop_rc") == 0 and not out.get("killed"),
        f"just-in-time checkpoint at step {step} (preStop answered): {ckpt} complete",
    )
    # The SIGTERM after preStop finds the runtime stopping: it does not turn the exit into 143.
    checks.check(
        out["rc"] == 0,
        f"the container exited {out['rc']} after the just-in-time checkpoint",
    )

    def recorded() -> str | None:
        name = f"/checkpoint-{step}"
        return next(
            (e["reason"] for e in job_events(cluster) if e.get("message", "").endswith(name)),
            None,
        )

    reason = wait_for(recorded, f"an Event for checkpoint-{step}", timeout=30)
    # The runtime marks the record (checkpointing.latestCheckpointReason: jit), so the Event is
    # JITCheckpoint whether an exec poll or the termination message reads it first.
    checks.check(
        reason == "JITCheckpoint",
        f"the reconciler recorded checkpoint-{step}: Event {reason}",
    )
    # The kubelet's last word on a deleted pod: remove it (the finalizer held it until now).
    cluster.kubectl(
        "delete", "pod", MASTER, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false"
    )
    p.release()
    return {"step": step, **out}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--keep", action="store_true", help="keep the cluster until Ctrl-C")
    ap.add_argument("--fast", action="store_true", help="a shorter job (200 steps of 0.06 s)")
    args = ap.parse_args()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C

    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="kubeckpt-demo-") as tmp:
        try:
            return run(args, Path(tmp))
        except KeyboardInterrupt:
            say("\ninterrupted")
            return 130


if __name__ == "__main__":
    sys.exit(main())
