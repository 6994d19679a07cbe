"""The kustomize install and the webhook's RBAC, against the real API server."""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from localcluster import LocalCluster, free_port
from tests.integration.webhook.conftest import WebhookProcess, local_webhook_configuration

REPO = Path(__file__).resolve().parents[3]


def kustomize(cluster: LocalCluster, path: str) -> list[dict]:
    out = cluster.kubectl("kustomize", str(REPO / path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("overlay", ["config/default", "config/certmanager"])
def test_overlay_builds_and_default_applies(cluster: LocalCluster, overlay: str) -> None:
    docs = kustomize(cluster, overlay)
    kinds = {d["kind"] for d in docs}
    assert {
        "CustomResourceDefinition",
        "MutatingWebhookConfiguration",
        "Deployment",
        "ClusterRole",
        "ServiceAccount",
    } <= kinds
    for d in docs:
        if d["kind"] == "Deployment":
            pod = d["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert sc["readOnlyRootFilesystem"] is True
        if d["kind"] in ("ClusterRole", "Role"):
            for rule in d["rules"]:
                assert "*" not in rule["verbs"]
                # Every rule names resources or (the metrics reader) non-resource URLs.
                names = rule.get("resources", []) + rule.get("nonResourceURLs", [])
                assert names and "*" not in names
    if overlay == "config/default":
        # Everything validates on the real API server (cert-manager's CRDs are not installed,
        # so the cert-manager overlay is checked for shape only).
        cluster.kubectl("create", "namespace", "kubeckpt-system", check=False)
        proc = cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-k",
            str(REPO / overlay),
            check=False,
        )
        assert proc.returncode == 0, proc.stderr


def test_webhook_runs_with_exactly_its_role(cluster: LocalCluster, tmp_path: Path) -> None:
    """kubeckpt-webhook started with the token of the ServiceAccount that config/rbac binds."""
    rbac = (REPO / "config" / "rbac" / "webhook_role.yaml").read_text()
    cluster.kubectl("create", "namespace", "kubeckpt-system", check=False)
    cluster.apply(rbac)
    kubeconfig = cluster.token_kubeconfig(
        tmp_path / "kubeconfig", "kubeckpt-webhook", "kubeckpt-system"
    )
    # RBAC names the real configuration; register it by URL for this test.
    port = free_port()
    cluster.apply(local_webhook_configuration(port, name="kubeckpt-webhook"))
    proc = WebhookProcess(
        cluster, port, tmp_path / "webhook.log", kubeconfig=kubeconfig, mwc_name="kubeckpt-webhook"
    )
    try:
        proc.start()  # ready: informers synced, certificate from the Secret, caBundle published
        # /metrics: refused without a token, served to a Prometheus bound to the reader role
        # (the webhook's own role lets it ask the API server: TokenReview, SubjectAccessReview).
        assert _scrape(proc.url, None) == 401
        cluster.apply((REPO / "config" / "rbac" / "metrics_reader_role.yaml").read_text())
        cluster.kubectl("create", "serviceaccount", "prom", "-n", "kubeckpt-system", check=False)
        cluster.kubectl(
            "create",
            "clusterrolebinding",
            "prom-kubeckpt-metrics",
            "--clusterrole=kubeckpt-metrics-reader",
            "--serviceaccount=kubeckpt-system:prom",
            check=False,
        )
        token = cluster.kubectl("create", "token", "prom", "-n", "kubeckpt-system").stdout.strip()
        assert _scrape(proc.url, token) == 200
        log = proc.tail()
        assert "forbidden" not in log.lower(), log
    finally:
        proc.stop()
        cluster.kubectl("delete", "mutatingwebhookconfiguration", "kubeckpt-webhook", check=False)
    # The role grants nothing beyond: e.g. reading other Secrets or pods is refused.
    for args in (
        ["get", "secrets", "-n", "kube-system"],
        ["get", "pods", "-A"],
        ["get", "mutatingwebhookconfiguration", "kubeckpt-webhook-it"],
    ):
        denied = subprocess.run(
            [str(cluster.binaries.kubectl), "--kubeconfig", str(kubeconfig), *args],  # type: ignore[union-attr]
            capture_output=True,
            text=True,
            check=False,
        )
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), args


def _scrape(url: str, token: str | None) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(url + "/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
