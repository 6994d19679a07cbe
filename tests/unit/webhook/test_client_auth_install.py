"""Installing client-certificate authentication of the API server: the kustomize component turns
it on over any overlay, and the local cluster's API server is configured to present its
certificate to kubeckpt's webhook, by the host names the API server matches."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from localcluster import admission_auth, pki

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "config"


def render(overlay: str, tmp_path: Path) -> dict[str, Any]:
    """`overlay` plus the component, as kustomize renders it: the webhook's Deployment."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not on PATH"
    d = tmp_path / overlay
    d.mkdir()
    rel = os.path.relpath(CONFIG, d)  # kustomize takes no absolute paths
    (d / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [f"{rel}/{overlay}"],
                "components": [f"{rel}/components/webhook-client-auth"],
            }
        )
    )
    proc = subprocess.run(
        [kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    [dep] = [
        doc
        for doc in yaml.safe_load_all(proc.stdout)
        if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"] == "kubeckpt-webhook"
    ]
    return dep


@pytest.mark.parametrize("overlay", ["default", "certmanager"])
def test_the_component_mounts_the_client_ca_and_passes_the_flag(
    overlay: str, tmp_path: Path
) -> None:
    spec = render(overlay, tmp_path)["spec"]["template"]["spec"]
    [c] = spec["containers"]
    assert "--client-ca-file=/etc/kubeckpt/client-ca/ca.crt" in c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["client-ca"] == {
        "name": "client-ca",
        "mountPath": "/etc/kubeckpt/client-ca",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["client-ca"]["configMap"] == {"name": "kubeckpt-webhook-client-ca"}
    if overlay == "certmanager":  # the overlay's own volume is kept beside ours
        assert "certs" in mounts and "certs" in volumes
    readme = (REPO / "README.md").read_text()
    assert "kubeckpt-webhook-client-ca" in readme and "webhook-client-auth" in readme


def test_the_api_server_presents_its_certificate_to_our_webhook_hosts(tmp_path: Path) -> None:
    admission_auth.write_pki(tmp_path)
    config_path = admission_auth.write_admission_config(
        tmp_path, (admission_auth.ADDON_SERVICE_HOST, "127.0.0.1:9443")
    )
    config = yaml.safe_load(config_path.read_text())
    assert (config["apiVersion"], config["kind"]) == (
        "apiserver.config.k8s.io/v1",
        "AdmissionConfiguration",
    )
    plugins = {p["name"]: p["configuration"] for p in config["plugins"]}
    assert set(plugins) == {"MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"}
    kubeconfig_path = Path(plugins["MutatingAdmissionWebhook"]["kubeConfigFile"])
    assert plugins["MutatingAdmissionWebhook"]["kind"] == "WebhookAdmissionConfiguration"
    assert kubeconfig_path.stat().st_mode & 0o077 == 0  # it holds a private key
    users = {u["name"]: u["user"] for u in yaml.safe_load(kubeconfig_path.read_text())["users"]}
    # config/webhook's Service on port 443: the API server looks up "<service>.<namespace>.svc"
    mwc = yaml.safe_load((CONFIG / "webhook" / "mutatingwebhookconfiguration.yaml").read_text())
    service = mwc["webhooks"][0]["clientConfig"]["service"]
    assert service["port"] == 443
    assert f"{service['name']}.{service['namespace']}.svc" == admission_auth.ADDON_SERVICE_HOST
    assert set(users) == {admission_auth.ADDON_SERVICE_HOST, "127.0.0.1:9443"}
    # the certificate is a client certificate of the CA the webhook is given
    cert = x509.load_pem_x509_certificate(
        base64.b64decode(users["127.0.0.1:9443"]["client-certificate-data"])
    )
    ca = pki.KeyPair.read(tmp_path, admission_auth.CA_NAME)
    assert cert.issuer == x509.load_pem_x509_certificate(ca.cert_pem).subject
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usage
    cn = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value
    assert cn == admission_auth.CLIENT_CN
