"""kubeckpt-reconciler (the console script) running with the token of the ServiceAccount that
config/rbac/reconciler_role.yaml binds, and nothing more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from progress_support import progress, start_job, write_atomic

from localcluster import LocalCluster

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(sys.executable).parent / "kubeckpt-reconciler"


def tp_status(cluster: LocalCluster, ns: str, name: str) -> dict:
    proc = cluster.kubectl("get", "tp", name, "-n", ns, "-o", "json", check=False)
    return (json.loads(proc.stdout).get("status") or {}) if proc.returncode == 0 else {}


def wait(check, what: str, within: float) -> object:
    deadline = time.monotonic() + within
    while not (r := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        time.sleep(0.2)
    return r


def test_reconciler_runs_with_exactly_its_role(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("create", "namespace", "kubeckpt-system", check=False)
    cluster.apply((REPO / "config" / "rbac" / "reconciler_role.yaml").read_text())
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "kubeconfig", "kubeckpt-reconciler", "kubeckpt-system"
    )
    path = start_job(cluster, namespace, "rbac", progress(5))
    log = tmp_path / "reconciler.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(SCRIPT),
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                "kubeckpt-system",
                "--port",
                "0",
                "--poll-early",
                "1",
                "--poll-recent",
                "1",
                "--poll-stale",
                "1",
                "--early-window",
                "0",
                "--lease-duration",
                "4",
                "--renew-deadline",
                "3",
                "--retry-period",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LOG_LEVEL": "INFO"},
        )
    try:
        ck = {"enabled": True, "latestCheckpoint": "/ckpt/checkpoint-5"}
        write_atomic(path, progress(5, checkpointing=ck))
        wait(lambda: tp_status(cluster, namespace, "rbac").get("step") == 5, "status", 90)
        write_atomic(path, progress(6, checkpointing=ck))
        wait(lambda: tp_status(cluster, namespace, "rbac").get("step") == 6, "status", 15)
        # the Event went through (create) and the Lease is held
        wait(
            lambda: "CheckpointSaved" in cluster.kubectl("get", "events", "-n", namespace).stdout,
            "the CheckpointSaved event",
            15,
        )
        lease = json.loads(
            cluster.kubectl(
                "get", "lease", "kubeckpt-reconciler", "-n", "kubeckpt-system", "-o", "json"
            ).stdout
        )
        assert lease["spec"]["holderIdentity"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    text = log.read_text()
    assert "forbidden" not in text.lower(), text[-4000:]
    assert proc.returncode == 0, text[-4000:]
    # The role grants nothing beyond.
    for args in (
        ["get", "secrets", "-n", "kube-system"],
        ["delete", "tp", "rbac", "-n", namespace],
        ["patch", "pytorchjob", "rbac", "-n", namespace, "--type=merge", "-p", "{}"],
        ["get", "pytorchjob", "rbac", "-n", namespace],
    ):
        denied = subprocess.run(
            [str(cluster.binaries.kubectl), "--kubeconfig", str(kubeconfig), *args],  # type: ignore[union-attr]
            capture_output=True,
            text=True,
            check=False,
        )
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), args


def test_default_install_runs_the_reconciler_under_its_account(cluster: LocalCluster) -> None:
    out = cluster.kubectl("kustomize", str(REPO / "config" / "default")).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    dep = next(
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "kubeckpt-reconciler"
    )
    pod = dep["spec"]["template"]["spec"]
    assert dep["metadata"]["namespace"] == "kubeckpt-system"
    assert pod["serviceAccountName"] == "kubeckpt-reconciler"
    (c,) = pod["containers"]
    assert c["image"] == "kubeckpt/kubeckpt:0.1.0" and c["command"] == ["kubeckpt-reconciler"]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ClusterRoleBinding", "kubeckpt-reconciler") in names
    assert ("RoleBinding", "kubeckpt-reconciler-leader-election") in names
