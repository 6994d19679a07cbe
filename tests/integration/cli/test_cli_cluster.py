"""`kubeckpt` (and `kubectl kubeckpt`) against the local control plane: TrainingProgress objects
with the status the controller applies, PyTorchJobs whose pods the training-operator creates on
KWOK nodes, real RBAC, Events, and pods/exec served by KWOK (a local process with the pod's env).
The live view runs in a real terminal (tmux) and is read back from the screen."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import LocalCluster, free_port, wait_for
from localcluster.pods import running, wait_pod
from tests.support.cli_objects import (
    REPO,
    condition,
    injected_pod,
    run_cli,
    tp,
    training_status,
)
from trainer_runtime.contract import build_manifest
from trainer_runtime.storage import LocalTier

pytestmark = pytest.mark.timeout(300)


def kubeckpt(cluster: LocalCluster, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run_cli("--kubeconfig", str(cluster.kubeconfig), *args, **kw)


def set_status(cluster: LocalCluster, ns: str, name: str, status: dict[str, Any]) -> None:
    """Write the status as the controller does: through the status subresource."""
    cluster.kubectl(
        "patch",
        "tp",
        name,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def make_tp(cluster: LocalCluster, ns: str, name: str, status: dict[str, Any], **kw: Any) -> None:
    cluster.apply(tp(name, ns, **kw))
    set_status(cluster, ns, name, status)


@pytest.fixture
def other_namespace(cluster: LocalCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_status_table_json_yaml_and_namespaces(
    cluster: LocalCluster, namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    make_tp(cluster, namespace, "llama", training_status(30))
    conds = [condition("Progressing", "True", "StepAdvanced"), condition("Stalled", "True", "x")]
    stalled = training_status(80, conditions=conds)
    make_tp(cluster, namespace, "bert", stalled, kind="TrainJob")
    done = training_status(100, conditions=[condition("Completed", "True", "JobSucceeded")])
    make_tp(cluster, other_namespace, "gpt", done)

    proc = kubeckpt(cluster, "status", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "KIND", "STATE", "STEP"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"bert", "llama"}  # only this namespace
    assert rows["llama"][1:5] == ["PyTorchJob", "Training", "30/100", "30.0%"]
    assert rows["llama"][7] == "checkpoint-30"
    assert rows["bert"][1:5] == ["TrainJob", "Stalled", "80/100", "80.0%"]

    every = kubeckpt(cluster, "status", "-A")
    assert every.returncode == 0, every.stderr
    ours = (namespace, other_namespace)
    mine = [ln.split() for ln in every.stdout.splitlines() if ln.split()[0] in ours]
    assert sorted((r[0], r[1], r[3]) for r in mine) == sorted(
        [
            (namespace, "bert", "Stalled"),
            (namespace, "llama", "Training"),
            (other_namespace, "gpt", "Succeeded"),
        ]
    )
    assert every.stdout.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]

    one = kubeckpt(cluster, "status", "llama", "-n", namespace, "-o", "json")
    assert one.returncode == 0, one.stderr
    doc = json.loads(one.stdout)
    assert (doc["namespace"], doc["name"], doc["kind"], doc["state"]) == (
        namespace,
        "llama",
        "PyTorchJob",
        "Training",
    )
    assert (doc["step"], doc["totalSteps"], doc["percentComplete"]) == (30, 100, 30.0)
    assert doc["latestCheckpoint"] == "/mnt/kubeckpt/ns/job/checkpoint-30"
    assert doc["latestCheckpointReason"] == "periodic"
    listed = yaml.safe_load(kubeckpt(cluster, "-o", "yaml", "-n", other_namespace, "status").stdout)
    assert [i["name"] for i in listed["items"]] == ["gpt"]
    assert listed["items"][0]["state"] == "Succeeded"

    # No -n: the kubeconfig context's namespace, as kubectl
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = other_namespace
    scoped = tmp_path / "kubeconfig"
    scoped.write_text(yaml.safe_dump(config))
    proc = run_cli("status", env={"KUBECONFIG": str(scoped)})
    assert proc.returncode == 0, proc.stderr
    assert [ln.split()[0] for ln in proc.stdout.splitlines()[1:]] == ["gpt"]

    empty = kubeckpt(cluster, "status", "-n", "kube-public")
    assert empty.returncode == 0 and empty.stdout == ""
    assert 'No training jobs found in namespace "kube-public"' in empty.stderr


def test_state_field_from_the_controller_is_shown(cluster: LocalCluster, namespace: str) -> None:
    # A controller that writes status.state: its word wins over the conditions.
    make_tp(cluster, namespace, "susp", training_status(40, state="Suspended"))
    proc = kubeckpt(cluster, "status", "susp", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[2] == "Suspended"


def test_not_found_unreachable_and_forbidden(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    missing = kubeckpt(cluster, "status", "nope", "-n", namespace)
    assert missing.returncode == 3
    assert missing.stderr == (
        f'kubeckpt: no training job "nope" in namespace "{namespace}" (no TrainingProgress of '
        "that name): check -n, or list the jobs with `kubeckpt status -A`\n"
    )
    assert kubeckpt(cluster, "describe", "nope", "-n", namespace).returncode == 3
    assert kubeckpt(cluster, "checkpoints", "nope", "-n", namespace).returncode == 3

    # An API server that is not there (a port nothing listens on)
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    dead = f"https://127.0.0.1:{free_port()}"
    for c in config["clusters"]:
        c["cluster"]["server"] = dead
    path = tmp_path / "dead"
    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    down = run_cli("--kubeconfig", str(path), "status", "-n", namespace)
    assert down.returncode == 1
    assert down.stderr.startswith(f"kubeckpt: cannot reach the API server at {dead} (")
    assert down.stderr.count("\n") == 1 and "Traceback" not in down.stderr
    assert time.monotonic() - started < 30

    # A ServiceAccount with no rights at all, then with the TrainingProgress reads only
    make_tp(cluster, namespace, "llama", training_status(30, observedPod="llama-master-0"))
    cluster.kubectl("create", "serviceaccount", "viewer", "-n", namespace)
    kc = cluster.token_kubeconfig(tmp_path / "viewer", "viewer", namespace)
    user = f'User "system:serviceaccount:{namespace}:viewer"'
    denied = run_cli("--kubeconfig", str(kc), "status", "-n", namespace)
    assert denied.returncode == 1
    assert denied.stderr == (
        f"kubeckpt: forbidden: you cannot list trainingprogresses.kubeckpt.io in namespace "
        f'"{namespace}" ({user}): ask an admin for a Role that grants list on '
        "trainingprogresses.kubeckpt.io\n"
    )
    all_ns = run_cli("--kubeconfig", str(kc), "status", "-A")
    assert "cannot list trainingprogresses.kubeckpt.io in any namespace (-A)" in all_ns.stderr
    cluster.kubectl(
        "create",
        "role",
        "tp-reader",
        "-n",
        namespace,
        "--verb=get,list,watch",
        "--resource=trainingprogresses.kubeckpt.io",
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "tp-reader",
        "-n",
        namespace,
        "--role=tp-reader",
        f"--serviceaccount={namespace}:viewer",
    )

    def reads() -> bool:
        return run_cli("--kubeconfig", str(kc), "status", "-n", namespace).returncode == 0

    wait_for(reads, "the RoleBinding to take effect", timeout=30)
    no_pods = run_cli("--kubeconfig", str(kc), "describe", "llama", "-n", namespace)
    assert no_pods.returncode == 1
    assert no_pods.stderr.startswith(
        f'kubeckpt: forbidden: you cannot get pytorchjobs.kubeflow.org in namespace "{namespace}"'
    ) or no_pods.stderr.startswith(
        f'kubeckpt: forbidden: you cannot list pods in namespace "{namespace}"'
    ), no_pods.stderr
    no_exec = run_cli("--kubeconfig", str(kc), "checkpoints", "llama", "-n", namespace)
    assert no_exec.returncode == 1
    assert no_exec.stderr.startswith(
        f'kubeckpt: forbidden: you cannot get pods in namespace "{namespace}"'
    ), no_exec.stderr


def pytorchjob_from(pod: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    """A PyTorchJob whose pod template is an injected pod's: the training-operator then creates
    pods carrying exactly what the webhook injects (no webhook runs in these tests)."""
    meta = pod["metadata"]
    keep = ("training.kubeflow.org/", "kubeckpt.io/")
    template = {
        "metadata": {
            "labels": {
                k: v
                for k, v in meta["labels"].items()
                if not k.startswith("training.kubeflow.org/")
            },
            "annotations": {k: v for k, v in meta["annotations"].items() if k.startswith(keep)},
        },
        "spec": pod["spec"],
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
                "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
            }
        },
    }


def test_describe_shows_conditions_pods_injected_settings_and_events(
    cluster: LocalCluster, namespace: str
) -> None:
    pod = injected_pod("llama", namespace, storage="file:///mnt/ckpt")
    cluster.apply(pytorchjob_from(pod, "llama", namespace))
    wait_pod(cluster, namespace, "llama-master-0", running, "running", timeout=60)
    status = training_status(
        30,
        observedPod="llama-master-0",
        learningRate="0.000050",
        resumedFrom="checkpoint-20",
        conditions=[
            condition("Progressing", "True", "StepAdvanced", "step 30 of 100"),
            condition("Checkpointing", "True", "CheckpointSaved", "checkpoint-30 saved"),
        ],
    )
    make_tp(cluster, namespace, "llama", status)
    job_uid = json.loads(
        cluster.kubectl("get", "pytorchjob", "llama", "-n", namespace, "-o", "json").stdout
    )["metadata"]["uid"]
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "llama.ckpt", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "llama",
                "namespace": namespace,
                "uid": job_uid,
            },
            "reason": "CheckpointSaved",
            "message": "checkpoint at step 30: /mnt/ckpt/x/llama/checkpoint-30",
            "type": "Normal",
            "source": {"component": "kubeckpt"},
            "count": 1,
            "firstTimestamp": "2026-03-01T12:00:00Z",
            "lastTimestamp": "2026-03-01T12:00:00Z",
        }
    )
    proc = kubeckpt(cluster, "describe", "llama", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    lines = out.splitlines()
    assert lines[0].split() == ["Name:", "llama"]
    assert f"Namespace:     {namespace}" in lines
    assert "Job:           PyTorchJob llama (kubeflow.org/v1)" in lines
    assert "State:         Training" in lines
    assert any(ln.startswith("Progress:      step 30/100, 30.0%, epoch 1") for ln in lines)
    assert "Resumed from:  checkpoint-20" in lines
    assert any(ln.split()[:3] == ["Checkpointing", "True", "CheckpointSaved"] for ln in lines)
    pods = {ln.split()[0]: ln.split() for ln in lines if ln.startswith("  llama-")}
    assert pods["llama-master-0"][1:4] == ["Running", "yes", "yes"]
    assert pods["llama-worker-0"][2] == "yes"  # injected, not rank 0: RANK0 is blank
    assert "Injected settings (pod llama-master-0, container pytorch):" in lines
    assert any(ln.startswith("  Policy:      team-default (kubeckpt ") for ln in lines)
    assert f"    CHECKPOINT_URI=/mnt/ckpt/{namespace}/llama" in lines
    assert "    CHECKPOINT_INTERVAL=600" in lines
    assert "    KUBECKPT_NAMESPACE=<field metadata.namespace>" in lines
    assert "  kubeckpt.io/interval: 10m" in lines
    assert any(ln.startswith("  preStop:     ") for ln in lines)
    events = out[out.index("Events:") :]
    assert "CheckpointSaved" in events and "PyTorchJob/llama" in events
    assert "SuccessfulCreatePod" in events  # the training-operator's own, on the same job

    doc = json.loads(kubeckpt(cluster, "describe", "llama", "-n", namespace, "-o", "json").stdout)
    assert doc["jobExists"] is True
    assert {p["pod"] for p in doc["pods"]} == {"llama-master-0", "llama-worker-0"}
    assert any(e["reason"] == "CheckpointSaved" for e in doc["events"])


def save(tier: LocalTier, step: int, size: int) -> None:
    d = tier.begin(step)
    (d / "model.pt").write_bytes(b"m" * size)
    manifest = build_manifest(
        d, step=step, epoch=0, world_size=1, framework="torch", tier=tier.name
    )
    tier.commit(step, manifest)


def exec_into(cluster: LocalCluster, ns: str, pod: str, workdir: Path, env: dict[str, str]) -> None:
    """KWOK runs `exec` in this pod as a local process with `env` (the container's env)."""
    cluster.apply(
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Exec",
            "metadata": {"name": pod, "namespace": ns},
            "spec": {
                "execs": [
                    {
                        "local": {
                            "workDir": str(workdir),
                            "envs": [{"name": k, "value": v} for k, v in env.items()],
                        }
                    }
                ]
            },
        }
    )


def test_checkpoints_listed_through_the_rank0_pod(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    pod = injected_pod("llama", namespace, storage="file:///mnt/ckpt")
    cluster.apply(pod)
    wait_pod(cluster, namespace, "llama-master-0", running, "running", timeout=60)
    persistent = LocalTier(tmp_path / "persistent", "persistent")
    local = LocalTier(tmp_path / "local", "local")
    for step in (10, 20):
        save(persistent, step, 2048)
    save(local, 25, 512)
    (tmp_path / "persistent" / "checkpoint-30").mkdir()  # a save that did not finish
    exec_into(
        cluster,
        namespace,
        "llama-master-0",
        tmp_path,
        {
            "CHECKPOINT_URI": str(tmp_path / "persistent"),
            "CHECKPOINT_LOCAL_DIR": str(tmp_path / "local"),
            "PYTHONPATH": str(REPO),
        },
    )
    status = training_status(20, observedPod="llama-master-0")
    status["checkpointing"]["latestCheckpoint"] = str(tmp_path / "persistent" / "checkpoint-20")
    status["checkpointing"]["latestCheckpointReason"] = "jit"
    make_tp(cluster, namespace, "llama", status)

    proc = kubeckpt(cluster, "checkpoints", "llama", "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [*"TIER CHECKPOINT STEP STATE REASON SAVED AGE SIZE FILES".split()]
    rows = [ln.split() for ln in lines[1:5]]
    assert [r[:5] for r in rows] == [
        ["persistent", "checkpoint-30", "30", "incomplete", "-"],
        ["local", "checkpoint-25", "25", "complete", "-"],
        ["persistent", "checkpoint-20", "20", "complete", "jit"],
        ["persistent", "checkpoint-10", "10", "complete", "-"],
    ]
    assert rows[2][-3:] == ["2.0", "KiB", "1"]
    assert "checkpoint-30 (persistent): no manifest: the save did not finish" in lines

    doc = json.loads(
        kubeckpt(cluster, "checkpoints", "llama", "-n", namespace, "-o", "json").stdout
    )
    assert doc["pod"] == "llama-master-0" and doc["container"] == "pytorch"
    assert [(c["tier"], c["step"], c["complete"]) for c in doc["checkpoints"]] == [
        ("persistent", 30, False),
        ("local", 25, True),
        ("persistent", 20, True),
        ("persistent", 10, True),
    ]
    assert doc["checkpoints"][2]["bytes"] == 2048

    # The observed pod gone, and no other rank-0 pod: one line saying where the latest one is
    set_status(cluster, namespace, "llama", {"observedPod": "llama-master-9"})
    cluster.kubectl(
        "delete", "pod", "llama-master-0", "-n", namespace, "--grace-period=0", "--force"
    )

    def pod_gone() -> bool:
        got = cluster.kubectl("get", "pod", "llama-master-0", "-n", namespace, check=False)
        return got.returncode != 0

    wait_for(pod_gone, "the pod to go", timeout=30)
    gone = kubeckpt(cluster, "checkpoints", "llama", "-n", namespace)
    assert gone.returncode == 3
    assert gone.stderr.startswith(
        'kubeckpt: cannot list the checkpoints of "llama": its pod llama-master-9 is gone'
    )
    assert f"the latest checkpoint recorded is {tmp_path}/persistent/checkpoint-20" in gone.stderr

    # A rank-0 pod that cannot start (no node matches): found by its labels, refused as not running
    stuck = injected_pod("llama", namespace, storage="file:///mnt/ckpt")
    stuck["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "no-such-node"}
    cluster.apply(stuck)
    pending = kubeckpt(cluster, "checkpoints", "llama", "-n", namespace)
    assert pending.returncode == 1
    assert pending.stderr.startswith("kubeckpt: pod llama-master-0 is Pending, not running")


def test_checkpoints_when_the_pod_cannot_run_the_listing(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    pod = injected_pod("bert", namespace, storage="file:///mnt/ckpt")
    cluster.apply(pod)
    wait_pod(cluster, namespace, "bert-master-0", running, "running", timeout=60)
    make_tp(cluster, namespace, "bert", training_status(5, observedPod="bert-master-0"))
    # an image whose python has no kubeckpt runtime: the module is not on its path
    exec_into(cluster, namespace, "bert-master-0", tmp_path, {"PYTHONPATH": str(tmp_path)})
    proc = kubeckpt(cluster, "checkpoints", "bert", "-n", namespace)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "kubeckpt: the image of pod bert-master-0 (container pytorch) has no "
        "trainer_runtime.listing: install kubeckpt's runtime"
    ), proc.stderr
    # a listing that never answers: bounded by --timeout
    slow = tmp_path / "slow"
    (slow / "trainer_runtime").mkdir(parents=True)
    (slow / "trainer_runtime" / "__init__.py").write_text("")
    (slow / "trainer_runtime" / "listing.py").write_text("import time\ntime.sleep(60)\n")
    exec_into(cluster, namespace, "bert-master-0", tmp_path, {"PYTHONPATH": str(slow)})
    started = time.monotonic()
    proc = kubeckpt(cluster, "checkpoints", "bert", "-n", namespace, "--timeout", "3")
    assert proc.returncode == 1
    assert "took over 3s" in proc.stderr and proc.stderr.count("\n") == 1
    assert time.monotonic() - started < 20


def test_kubectl_runs_it_as_a_plugin(cluster: LocalCluster, namespace: str, tmp_path: Path) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubeckpt"] == scripts["kubectl-kubeckpt"] == "kubeckpt_cli.main:main"
    module, func = scripts["kubectl-kubeckpt"].split(":")
    # What pip generates for the console script, pointed at this checkout
    plugin = tmp_path / "bin" / "kubectl-kubeckpt"
    plugin.parent.mkdir()
    plugin.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
        f"from {module} import {func}\nsys.exit({func}())\n"
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    make_tp(cluster, namespace, "llama", training_status(30))
    assert cluster.binaries is not None
    env = {**os.environ, "PATH": f"{plugin.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [
            str(cluster.binaries.kubectl),
            "kubeckpt",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "status",
            "-n",
            namespace,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[:3] == ["llama", "PyTorchJob", "Training"]


class Tmux:
    """A tmux server of our own (its own socket), one window of a fixed size."""

    def __init__(self, tmp: Path) -> None:
        exe = shutil.which("tmux")
        if exe is None:
            pytest.fail("tmux is needed: apt-get install -y tmux (hack/build-binaries.sh)")
        self.base = [exe, "-S", str(tmp / "tmux.sock")]

    def run(self, *args: str) -> str:
        return subprocess.run(
            [*self.base, *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "cli")

    def wait_screen(self, check: Callable[[str], bool], what: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if check(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n{text}")
            time.sleep(0.2)

    def kill(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, check=False, timeout=10)


def bar_of(screen: str, job: str) -> tuple[int, int]:
    """(filled, all) cells of the job's bar on the screen."""
    row = next(line for line in screen.splitlines() if line.split()[:1] == [job])
    return row.count("\u2588"), row.count("\u2588") + row.count("\u2591")


def filled(fraction: float, cells: int) -> tuple[int, int]:
    return round(fraction * cells), cells


def test_watch_redraws_the_bar_in_a_terminal_and_exits_on_ctrl_c(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    make_tp(cluster, namespace, "llama", training_status(30))
    make_tp(cluster, namespace, "bert", training_status(10))
    tmux = Tmux(tmp_path)
    cli = shlex.join(
        [
            sys.executable,
            "-m",
            "kubeckpt_cli",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "status",
            "--watch",
            "-n",
            namespace,
        ]
    )
    # COLUMNS/LINES unset: the size is the terminal's (tmux may hand its default-size down)
    env = (
        f"-u COLUMNS -u LINES PYTHONPATH={shlex.quote(str(REPO))} LANG=C.UTF-8 TERM=xterm-256color"
    )
    command = f"cd {shlex.quote(str(REPO))} && env {env} {cli}; echo EXIT=$?; sleep 600"
    tmux.run("new-session", "-d", "-s", "cli", "-x", "160", "-y", "20", "bash", "-c", command)
    try:
        screen = tmux.wait_screen(lambda s: "30/100" in s and "10/100" in s, "the first frame")
        assert "Ctrl-C to exit" in screen
        cells = bar_of(screen, "llama")[1]
        assert cells == 40  # 160 columns: every column, and the widest bar
        assert bar_of(screen, "llama") == filled(0.3, cells)
        assert bar_of(screen, "bert") == filled(0.1, cells)
        set_status(cluster, namespace, "llama", {"step": 60, "percentComplete": "60.0"})
        screen = tmux.wait_screen(lambda s: "60/100" in s, "the bar to advance")
        assert bar_of(screen, "llama") == filled(0.6, cells)
        assert bar_of(screen, "bert") == filled(0.1, cells)
        assert "30/100" not in screen  # redrawn in place, not appended
        # a job that finishes, and one that appears
        done = training_status(100, conditions=[condition("Completed", "True", "JobSucceeded")])
        set_status(cluster, namespace, "bert", done)
        make_tp(cluster, namespace, "gpt", training_status(50))
        screen = tmux.wait_screen(
            lambda s: "Succeeded" in s and "50/100" in s, "the finished and the new job"
        )
        assert bar_of(screen, "bert") == filled(1.0, cells)
        assert bar_of(screen, "gpt") == filled(0.5, cells)
        tmux.run("send-keys", "-t", "cli", "C-c")
        screen = tmux.wait_screen(lambda s: "EXIT=" in s, "the CLI to exit")
        assert "EXIT=0" in screen, screen
        assert "Traceback" not in screen and "KeyboardInterrupt" not in screen
    finally:
        tmux.kill()


def _default_sigint() -> None:
    """In the child before exec: Ctrl-C's default. A suite started in the background by a
    non-interactive shell (`make test &`) ignores SIGINT, a child inherits that, and this test is
    of the CLI's own Ctrl-C handling (it hung 15 s so in such a run, then failed)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_watch_into_a_pipe_prints_the_table_at_each_change(
    cluster: LocalCluster, namespace: str
) -> None:
    make_tp(cluster, namespace, "llama", training_status(30))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "kubeckpt_cli", "--kubeconfig", str(cluster.kubeconfig)]
    proc = subprocess.Popen(
        [*argv, "status", "-w", "-n", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        preexec_fn=_default_sigint,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split()[:3] == ["NAME", "KIND", "STATE"]
        assert proc.stdout.readline().split()[:4] == ["llama", "PyTorchJob", "Training", "30/100"]
        set_status(cluster, namespace, "llama", {"step": 45, "percentComplete": "45.0"})
        assert proc.stdout.readline().split()[0] == "NAME"
        assert proc.stdout.readline().split()[3:5] == ["45/100", "45.0%"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
