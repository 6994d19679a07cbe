"""Pods for the real node: they select it, tolerate its taint and never pull."""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from localcluster import LocalCluster
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


def diagnose(cluster: LocalCluster, ns: str, pods: tuple[str, ...]) -> str:
    """The pods, their processes and their logs (this run's and the previous container's)."""
    out = [cluster.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False).stdout]
    for name in pods:
        out.append(f"--- {name}: processes")
        out.append(pod_sh(cluster, ns, name, "ps -eo pid,stat,etime,args 2>/dev/null || ls /proc"))
        for previous in ("--previous", ""):
            args = ("logs", name, "-n", ns, "-c", "pytorch", "--tail=30")
            logs = cluster.kubectl(*args, *((previous,) if previous else ()), check=False)
            out.append(f"--- {name} logs {previous}\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)


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
