"""The local API server authenticates itself to kubeckpt's webhook with a client certificate.

kube-apiserver `--admission-control-config-file` names an AdmissionConfiguration whose
WebhookAdmissionConfiguration (for MutatingAdmissionWebhook and ValidatingAdmissionWebhook) has
a kubeConfigFile; in it, each `users[]` entry named after a webhook's host gives the credentials
the API server presents when it calls that webhook (Kubernetes docs, "Dynamic Admission Control",
"Authenticate apiservers"): for a Service on port 443, `<service>.<namespace>.svc`; for a URL, its
host and port as written. The file is read once, when the API server starts, so the local
webhook's port is chosen before (`LocalCluster.ports["kubeckpt_webhook"]`).

A CA of its own signs that certificate (`webhook-client-ca`): the webhook's `--client-ca-file`
then trusts the API server and no one else (the cluster's own CA signs every user's and node's
certificate). config/components/webhook-client-auth installs the same on a real cluster.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

import yaml

from . import pki

CA_NAME = "webhook-client-ca"
CLIENT_NAME = "apiserver-webhook-client"
# The certificate's common name, which the webhook may require (--client-allowed-names).
CLIENT_CN = "kube-apiserver-webhook-client"
# The add-on installed from config/ (tests/node): Service kubeckpt-webhook, port 443.
ADDON_SERVICE_HOST = "kubeckpt-webhook.kubeckpt-system.svc"


def write_pki(directory: Path) -> None:
    """The client CA and the API server's certificate, as `<name>.crt`/`.key` in `directory`."""
    ca = pki.make_ca("kubeckpt-webhook-client-ca")
    ca.write(directory, CA_NAME)
    pki.issue(ca, CLIENT_CN, client=True).write(directory, CLIENT_NAME)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_admission_config(directory: Path, hosts: Sequence[str]) -> Path:
    """The AdmissionConfiguration and its kubeconfig in `directory` (from `write_pki`'s files):
    the API server presents its client certificate to a webhook at each of `hosts`, and to no
    other. Returns the path for --admission-control-config-file."""
    cert = (directory / f"{CLIENT_NAME}.crt").read_bytes()
    key = (directory / f"{CLIENT_NAME}.key").read_bytes()
    user = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    kubeconfig = directory / "admission-webhooks.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [{"name": host, "user": user} for host in hosts],
            }
        )
    )
    kubeconfig.chmod(0o600)
    webhook_config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    config = directory / "admission.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": plugin, "configuration": webhook_config}
                    for plugin in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
                ],
            }
        )
    )
    return config
