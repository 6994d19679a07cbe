"""kubeckpt-reconciler (the console script) running with the token of the ServiceAccount that
config/rbac/reconciler_role.yaml binds, and nothing more, under config/policy's admission
policies on that account."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from progress_support import progress, start_job, write_atomic

from kubeckpt_api import __version__
from localcluster import LocalCluster, free_port
from tests.support import policies
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION as LAST_CHECKPOINT_STEP,
)

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
    # The admission policies, with the KWOK pod's progress file (a host path) allowed as an admin
    # allows a TRAINING_PROGRESS_FILE set elsewhere; the namespace opted in for reading with the
    # label that stays while _policy_status_is_written takes kubeckpt.io/inject away.
    admission = policies.with_progress_files(policies.policies(cluster), str(path))
    policies.install(cluster, admission)
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/progress-exec=enabled")
    metrics_port = free_port()
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
                "--bind-address",
                "127.0.0.1",
                "--metrics-port",
                str(metrics_port),
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
        # the pods' last-checkpoint annotation went through (patch on pods)
        wait(
            lambda: _annotation(cluster, namespace, "rbac-master-0", LAST_CHECKPOINT_STEP) == "5",
            "the last-checkpoint annotation",
            15,
        )
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
        _metrics_need_a_token_allowed_to_get_them(cluster, kubeconfig, metrics_port)
        _policy_status_is_written(cluster, namespace)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        policies.remove(cluster, admission)
    text = log.read_text()
    assert "forbidden" not in text.lower(), text[-4000:]
    assert proc.returncode == 0, text[-4000:]
    # The role grants nothing beyond.
    for args in (
        ["get", "secrets", "-n", "kube-system"],
        ["delete", "tp", "rbac", "-n", namespace],
        ["patch", "pytorchjob", "rbac", "-n", namespace, "--type=merge", "-p", "{}"],
        ["get", "pytorchjob", "rbac", "-n", namespace],
        ["delete", "pod", "rbac-master-0", "-n", namespace],
    ):
        denied = subprocess.run(
            [str(cluster.binaries.kubectl), "--kubeconfig", str(kubeconfig), *args],  # type: ignore[union-attr]
            capture_output=True,
            text=True,
            check=False,
        )
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), args


def _annotation(cluster: LocalCluster, ns: str, pod: str, key: str) -> str | None:
    proc = cluster.kubectl("get", "pod", pod, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    return (json.loads(proc.stdout)["metadata"].get("annotations") or {}).get(key)


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
    assert c["image"] == f"kubeckpt/kubeckpt:{__version__}"
    assert c["command"] == ["kubeckpt-reconciler"]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ClusterRoleBinding", "kubeckpt-reconciler") in names
    assert ("RoleBinding", "kubeckpt-reconciler-leader-election") in names


def _scrape(port: int, token: str | None) -> tuple[int, str]:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # self-signed: the token matters
    req = urllib.request.Request(f"https://127.0.0.1:{port}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _metrics_need_a_token_allowed_to_get_them(
    cluster: LocalCluster, kubeconfig: Path, port: int
) -> None:
    """/metrics over HTTPS: no token 401, a token without the role 403 (the reconciler's own),
    a ServiceAccount bound to kubeckpt-metrics-reader (a Prometheus) 200. The reconciler checks
    them with TokenReview and SubjectAccessReview, which its role allows."""
    assert _scrape(port, None)[0] == 401
    own = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    assert _scrape(port, own)[0] == 403
    cluster.apply((REPO / "config" / "rbac" / "metrics_reader_role.yaml").read_text())
    cluster.kubectl("create", "serviceaccount", "prometheus", "-n", "kubeckpt-system", check=False)
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        "prometheus-kubeckpt-metrics",
        "--clusterrole=kubeckpt-metrics-reader",
        "--serviceaccount=kubeckpt-system:prometheus",
        check=False,
    )
    token = cluster.kubectl("create", "token", "prometheus", "-n", "kubeckpt-system").stdout
    _, text = wait(lambda: (r := _scrape(port, token.strip()))[0] == 200 and r, "200", 15)
    assert "kubeckpt_training_step" in text, text[:2000]
    assert _scrape(port, "not-a-token")[0] == 401


def _policy_status_is_written(cluster: LocalCluster, ns: str) -> None:
    """CheckpointPolicy status (patch on checkpointpolicies/status under the role): Ready with
    the opt-in hint, Shadowed by an older catch-all, the hint gone once the namespace opts in."""

    def ready(name: str) -> dict:
        proc = cluster.kubectl("get", "checkpointpolicy", name, "-n", ns, "-o", "json")
        obj = json.loads(proc.stdout)
        conds = (obj.get("status") or {}).get("conditions") or []
        c = next((c for c in conds if c["type"] == "Ready"), {})
        gen = obj["metadata"]["generation"]
        return c if c.get("observedGeneration") == gen else {}

    def policy(name: str, **spec: object) -> dict:
        return {
            "apiVersion": "kubeckpt.io/v1alpha1",
            "kind": "CheckpointPolicy",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"storage": {"uri": "pvc://ckpt/runs"}, **spec},
        }

    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject-", check=False)
    cluster.apply(policy("catchall"))
    c = wait(lambda: ready("catchall"), "the catch-all policy's status", 30)
    assert (c["status"], c["reason"]) == ("True", "Valid"), c
    assert "kubeckpt.io/inject=true" in c["message"], c
    time.sleep(1.1)  # a later creationTimestamp (seconds)
    cluster.apply(policy("narrow", selector={"matchLabels": {"team": "nlp"}}))
    c = wait(lambda: ready("narrow"), "the narrow policy's status", 30)
    assert (c["status"], c["reason"]) == ("False", "Shadowed") and "catchall" in c["message"], c
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled", "--overwrite")
    wait(
        lambda: "kubeckpt.io/inject=true" not in ready("catchall").get("message", "x"),
        "the opt-in hint to go",
        30,
    )
    cluster.kubectl("delete", "checkpointpolicy", "catchall", "-n", ns)
    wait(lambda: ready("narrow").get("status") == "True", "narrow to become Valid", 30)
    table = cluster.kubectl("get", "checkpointpolicy", "narrow", "-n", ns).stdout
    assert table.splitlines()[0].split()[:2] == ["NAME", "READY"], table
    assert table.splitlines()[1].split()[:2] == ["narrow", "True"], table
