"""Pods for the real node: they select it, tolerate its taint and never pull."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from localcluster import LocalCluster, wait_for
from localcluster.addon import real_node_placement
from localcluster.cluster import KWOK_TAINT
from localcluster.images import IMAGES
from localcluster.node import REAL_NODE_LABEL, REAL_NODE_TAINT

RUNTIME_IMAGE = IMAGES["runtime"]
REPO = Path(__file__).resolve().parents[2]


def load_demo() -> ModuleType:
    """hack/demo.py as a module: its job, policy and storage builders (hack/ is no package)."""
    spec = importlib.util.spec_from_file_location("kubeckpt_demo", REPO / "hack" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def progress_record(cluster: LocalCluster, ns: str, pod: str) -> dict[str, Any]:
    """The progress file of `pod`'s training container, or {} while it is missing or unreadable."""
    out = cluster.kubectl(
        "exec", pod, "-n", ns, "-c", "pytorch", "--",
        "cat", "/var/run/kubeckpt/progress.json", check=False,
    ).stdout  # fmt: skip
    try:
        return json.loads(out)
    except ValueError:
        return {}


def job_succeeded(cluster: LocalCluster, ns: str, job: str) -> bool:
    """The PyTorchJob's Succeeded condition is True."""
    p = cluster.kubectl("get", "pytorchjob", job, "-n", ns, "-o", "json", check=False)
    if p.returncode != 0:
        return False
    conds = (json.loads(p.stdout).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conds)


LOCAL = "/var/run/kubeckpt/local"  # the ramdisk tier in the training container


def demo_namespace(
    cluster: LocalCluster, ns: str, tmp_path: Path, policy: dict[str, Any], jobs: list[str]
) -> Path:
    """The demo's objects in `ns`, ready for its PyTorchJobs `jobs`: injection on, a
    PersistentVolume over a host directory (a directory per job), the training script, the token
    Secret, `policy`. Returns the volume's directory."""
    demo = load_demo()
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    storage = tmp_path / "volume"
    for name in jobs:
        (storage / "runs" / ns / name).mkdir(parents=True)
    for p in storage.rglob("*"):
        p.chmod(0o777)
    storage.chmod(0o777)
    cluster.apply(demo.storage_objects(storage, ns))
    script = REPO / "hack" / "demo" / "train.py"
    cluster.kubectl("create", "configmap", "train", "-n", ns, f"--from-file=train.py={script}")
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=x")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(policy))
    return storage


def peer_copy_policy() -> dict[str, Any]:
    """The demo's policy with a local tier every 20 steps and peer copies, the persistent tier's
    period out of reach (it stays empty)."""
    policy = load_demo().demo_policy(save_steps=1_000_000)
    policy["spec"]["localTier"] = {
        "enabled": True,
        "sizeLimit": "64Mi",
        "periodSteps": 20,
        "peerCopy": True,
    }
    return policy


def worker_copy_kept(cluster: LocalCluster, ns: str, job: str, at_least: int = 40) -> int | None:
    """The newest step (from `at_least`) that `job`'s worker holds, its master holds, and its
    master keeps the worker's copy of (node 1's, in `peers/1/`): what a replacement worker can
    fetch. None until there is one."""
    master, worker = f"{job}-master-0", f"{job}-worker-0"
    own = complete_steps(cluster, ns, worker, LOCAL)
    mine = complete_steps(cluster, ns, master, LOCAL)
    kept = complete_steps(cluster, ns, master, f"{LOCAL}/peers/1")
    common = own & mine & kept
    return max(common) if common and max(common) >= at_least else None


def same_final_parameters(
    cluster: LocalCluster, ns: str, jobs: tuple[str, str], steps: int
) -> None:
    """Both PyTorchJobs succeed at `steps` with bitwise equal final parameters."""
    digests = {}
    for name in jobs:
        wait_for(lambda n=name: job_succeeded(cluster, ns, n), f"{name} to succeed", timeout=300)
        out = cluster.kubectl("logs", f"{name}-master-0", "-n", ns, "-c", "pytorch").stdout
        assert f"finished at step {steps}" in out, out[-2000:]
        digests[name] = re.findall(r"final parameters sha256 (\w+)", out)
    assert digests[jobs[0]] and digests[jobs[0]] == digests[jobs[1]], digests


def pod_sh(cluster: LocalCluster, ns: str, pod: str, script: str) -> str:
    """`script` run by `sh -c` in `pod`'s training container: its stdout, or "" when it failed."""
    p = cluster.kubectl(
        "exec", pod, "-n", ns, "-c", "pytorch", "--", "sh", "-c", script, check=False
    )
    return p.stdout if p.returncode == 0 else ""


def complete_steps(cluster: LocalCluster, ns: str, pod: str, directory: str) -> set[int]:
    """The steps of the complete checkpoints (a manifest) directly in `directory` of `pod`."""
    out = pod_sh(cluster, ns, pod, f"ls -d {directory}/checkpoint-*/manifest.json 2>/dev/null")
    return {int(line.split("/checkpoint-")[1].split("/")[0]) for line in out.split()}


def pod_field(cluster: LocalCluster, ns: str, pod: str, jsonpath: str) -> str:
    """One field of `pod` (`{.metadata.uid}`, `{.spec.nodeName}`), or "" while it is missing."""
    p = cluster.kubectl("get", "pod", pod, "-n", ns, "-o", f"jsonpath={jsonpath}", check=False)
    return p.stdout.strip() if p.returncode == 0 else ""


# A peer keeping its ring predecessor's copy logs this at every local checkpoint: noise when the
# question is how a run started and ended.
ROUTINE = re.compile(r"^kubeckpt: keeping node \d+'s copy of step \d+ ")


def diagnose(cluster: LocalCluster, ns: str, pods: tuple[str, ...]) -> str:
    """The pods, their processes and their logs (this run's and the previous container's), all
    but the routine peer-copy lines: the restore's decisions are at the start of a run."""
    out = [cluster.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout]
    for name in pods:
        out.append(f"--- {name}: processes")
        out.append(pod_sh(cluster, ns, name, "ps -eo pid,stat,etime,args 2>/dev/null || ls /proc"))
        for previous in ("--previous", ""):
            args = ("logs", name, "-n", ns, "-c", "pytorch")
            logs = cluster.kubectl(*args, *((previous,) if previous else ()), check=False)
            lines = [line for line in logs.stdout.splitlines() if not ROUTINE.match(line)]
            text = "\n".join(lines[-80:])
            out.append(f"--- {name} logs {previous}\n{text}\n{logs.stderr}")
    return "\n".join(out)


def wait_resumed(cluster: LocalCluster, ns: str, job: str, timeout: float = 480) -> dict[str, Any]:
    """The progress record of `job`'s master once it says the run resumed. Fails with the pods'
    processes and logs on timeout, or at once when the job ends without having resumed (its
    progress file is then out of reach, and waiting longer cannot help)."""
    master, worker = f"{job}-master-0", f"{job}-worker-0"

    def resumed() -> tuple[str, dict[str, Any]] | None:
        rec = progress_record(cluster, ns, master)
        if rec.get("resumedFrom"):
            return "resumed", rec
        if job_succeeded(cluster, ns, job):
            return "ended", rec
        return None

    try:
        how, rec = wait_for(resumed, f"{job} to resume", timeout=timeout)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{diagnose(cluster, ns, (master, worker))}") from None
    if how == "ended":
        why = f"{job} succeeded without its master ever recording a resume"
        raise AssertionError(f"{why}\n{diagnose(cluster, ns, (master, worker))}")
    return rec


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    for c in containers:
        c.setdefault("imagePullPolicy", "Never")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": real_node_placement({"containers": containers, **spec}),
    }


def lister_pods(cluster: LocalCluster, ns: str) -> list[str]:
    out = cluster.kubectl(
        "get", "pods", "-n", ns, "-l", "kubeckpt.io/checkpoint-lister=true", "-o", "name"
    )
    return out.stdout.split()


@contextlib.contextmanager
def only_the_real_node_schedulable(cluster: LocalCluster) -> Iterator[None]:
    """A deleted job leaves no pod whose placement the lister pod could copy: for the while, the
    real node takes pods that do not tolerate its taint, and the KWOK nodes none."""
    names = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    real = [n["metadata"]["name"] for n in names if REAL_NODE_LABEL in n["metadata"]["labels"]]
    kwok = [n["metadata"]["name"] for n in names if n["metadata"]["name"] not in real]
    taint = f"{REAL_NODE_TAINT['key']}={REAL_NODE_TAINT['value']}:{REAL_NODE_TAINT['effect']}"
    fake = f"{KWOK_TAINT['key']}={KWOK_TAINT['value']}:{KWOK_TAINT['effect']}"
    for n in kwok:
        cluster.kubectl("taint", "nodes", n, fake, "--overwrite")
    for n in real:
        cluster.kubectl("taint", "nodes", n, f"{taint}-", check=False)
    try:
        yield
    finally:
        for n in real:
            cluster.kubectl("taint", "nodes", n, taint, "--overwrite", check=False)
        for n in kwok:
            cluster.kubectl("taint", "nodes", n, f"{fake}-", check=False)
