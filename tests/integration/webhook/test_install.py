"""The kustomize install and the webhook's RBAC, against the real API server."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from kubeckpt_api import __version__
from localcluster import LocalCluster, free_port
from tests.integration.webhook.conftest import WebhookProcess, local_webhook_configuration
from tests.support import policies

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
    """kubeckpt-webhook started with the token of the ServiceAccount that config/rbac binds,
    under config/policy's admission policies on that account."""
    rbac = (REPO / "config" / "rbac" / "webhook_role.yaml").read_text()
    cluster.kubectl("create", "namespace", "kubeckpt-system", check=False)
    cluster.apply(rbac)
    admission = policies.policies(cluster)
    policies.install(cluster, admission)
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
        policies.remove(cluster, admission)
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


def test_release_manifest_names_the_image_everywhere(cluster: LocalCluster, tmp_path: Path) -> None:
    """`make release`: one file, every image (the zero-code init image included) is $IMAGE at
    this version, every object carries the recommended labels, and the API server accepts it."""
    env = {**os.environ, "IMAGE": "registry.example.com/ml/kubeckpt", "DIST": str(tmp_path)}
    out = (
        subprocess.run(
            ["bash", str(REPO / "hack" / "release.sh")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    manifest = Path(out)
    assert manifest == tmp_path / f"kubeckpt-{__version__}.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    want = f"registry.example.com/ml/kubeckpt:{__version__}"
    images = []
    for d in docs:
        labels = d["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/name") == "kubeckpt", d["metadata"]["name"]
        assert labels.get("app.kubernetes.io/part-of") == "kubeckpt", d["metadata"]["name"]
        assert labels.get("app.kubernetes.io/version") == __version__, d["metadata"]["name"]
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                images.append(c["image"])
                images += [e["value"] for e in c.get("env", []) if e["name"].endswith("_IMAGE")]
    assert images and set(images) == {want}, images
    cluster.kubectl("create", "namespace", "kubeckpt-system", check=False)
    proc = cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "-f",
        str(manifest),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_namespace_users_read_progress_and_manage_policies(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """config/rbac/user_roles.yaml aggregates into the built-in view/edit roles: a namespace
    viewer can `kubectl get tp` (and not change it); an editor can also manage policies."""
    cluster.apply((REPO / "config" / "rbac" / "user_roles.yaml").read_text())
    ns = "team-rbac"
    cluster.kubectl("create", "namespace", ns, check=False)
    for user, role in (("ann", "view"), ("bob", "edit")):
        cluster.kubectl(
            "create",
            "rolebinding",
            f"{user}-{role}",
            f"--clusterrole={role}",
            f"--user={user}",
            "-n",
            ns,
            check=False,
        )

    def can(user: str, verb: str, resource: str, namespace: str = ns) -> bool:
        p = cluster.kubectl(
            "auth", "can-i", verb, resource, "-n", namespace, f"--as={user}", check=False
        )
        return p.stdout.strip() == "yes"

    # The controller-manager's aggregation controller merges the rules in asynchronously.
    deadline = time.monotonic() + 60
    while not (
        can("ann", "list", "trainingprogresses.kubeckpt.io")
        and can("bob", "create", "checkpointpolicies.kubeckpt.io")
    ):
        assert time.monotonic() < deadline, "view/edit never gained kubeckpt's rules"
        time.sleep(1)
    assert can("ann", "get", "trainingprogresses.kubeckpt.io")
    assert can("ann", "watch", "checkpointpolicies.kubeckpt.io")
    assert not can("ann", "create", "checkpointpolicies.kubeckpt.io")
    assert not can("ann", "patch", "trainingprogresses.kubeckpt.io")
    assert can("bob", "delete", "checkpointpolicies.kubeckpt.io")
    # Progress is the controller's: an editor reads it but cannot write it or its status.
    assert not can("bob", "update", "trainingprogresses.kubeckpt.io")
    assert not can("bob", "patch", "trainingprogresses.kubeckpt.io/status")
    # Only in the namespace they were given.
    assert not can("ann", "list", "trainingprogresses.kubeckpt.io", "default")


def test_sample_policy_is_accepted_and_has_no_ramdisk_by_default(cluster: LocalCluster) -> None:
    """The sample a user copies first validates, and does not put a tmpfs on their nodes."""
    sample = REPO / "config" / "samples" / "kubeckpt.io_v1alpha1_checkpointpolicy.yaml"
    policy = yaml.safe_load(sample.read_text())
    assert policy["spec"]["localTier"]["enabled"] is False
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-k", str(sample.parent), check=False
    )
    assert proc.returncode == 0, proc.stderr
