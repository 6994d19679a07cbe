"""What a pod needs to push its progress (issue 26), when its policy sets `progress.push`.

- a projected ServiceAccount token with our audience and a short life (the kubelet renews it), so
  the token is good for nothing but our endpoint and names the pod it is bound to;
- the CA that signed the endpoint's certificate, as `ca.crt`: when the webhook has it
  (`--progress-push-ca-file`, webhook/push_ca.py), the annotation `kubeckpt.io/progress-push-ca`
  that the webhook stamps on the pod (whatever the pod had there is overwritten), projected through
  the downward API; else the ConfigMap `kubeckpt-progress-ca` (key `ca.crt`) of the pod's
  namespace, projected optionally (an admin distributes it, e.g. with trust-manager; without it the
  push fails TLS and exec pull carries on);
- the URL of the job's status path on the endpoint's Service, as KUBECKPT_PROGRESS_PUSH_URL (our
  runtime) and, unless Trainer injected its own status server, Trainer's variables, which
  transformers' KubeflowCallback reads: a Trainer-configured pod keeps pushing to Trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kubeckpt_api.jobkinds import JobIdentity
from kubeckpt_api.optin import PUSH_CA_ANNOTATION
from trainer_runtime.contract import RUN_DIR
from trainer_runtime.contract.env import (
    KUBECKPT_PROGRESS_PUSH_CA,
    KUBECKPT_PROGRESS_PUSH_TOKEN,
    KUBECKPT_PROGRESS_PUSH_URL,
    KUBEFLOW_TRAINER_SERVER_CA_CERT,
    KUBEFLOW_TRAINER_SERVER_TOKEN,
    KUBEFLOW_TRAINER_SERVER_URL,
)

PUSH_AUDIENCE: Final = "kubeckpt-progress"  # progress_controller/push_auth.py checks it
PUSH_SERVICE_URL: Final = "https://kubeckpt-progress.kubeckpt-system.svc"
PUSH_VOLUME: Final = "kubeckpt-progress-push"
PUSH_DIR: Final = f"{RUN_DIR}-push"
CA_CONFIGMAP: Final = "kubeckpt-progress-ca"
TOKEN_SECONDS: Final = 600  # the least the API server allows; the kubelet renews at 80%


def push_url(job: JobIdentity, namespace: str, base: str = PUSH_SERVICE_URL) -> str:
    k = job.job_kind
    return f"{base}/apis/{k.group}/{k.version}/namespaces/{namespace}/{k.plural}/{job.name}/status"


def push_env(
    job: JobIdentity, namespace: str, container: Mapping[str, Any]
) -> list[dict[str, Any]]:
    url = push_url(job, namespace)
    token, ca = f"{PUSH_DIR}/token", f"{PUSH_DIR}/ca.crt"
    env = [
        {"name": KUBECKPT_PROGRESS_PUSH_URL, "value": url},
        {"name": KUBECKPT_PROGRESS_PUSH_TOKEN, "value": token},
        {"name": KUBECKPT_PROGRESS_PUSH_CA, "value": ca},
    ]
    names = {e.get("name") for e in container.get("env") or []}
    if KUBEFLOW_TRAINER_SERVER_URL not in names:  # Trainer's own server is not configured
        env += [
            {"name": KUBEFLOW_TRAINER_SERVER_URL, "value": url},
            {"name": KUBEFLOW_TRAINER_SERVER_TOKEN, "value": token},
            {"name": KUBEFLOW_TRAINER_SERVER_CA_CERT, "value": ca},
        ]
    return env


def ca_source(from_annotation: bool) -> dict[str, Any]:
    """Where the pod's ca.crt comes from: our annotation, or its namespace's optional ConfigMap."""
    if from_annotation:
        field = f"metadata.annotations['{PUSH_CA_ANNOTATION}']"
        item = {"path": "ca.crt", "fieldRef": {"apiVersion": "v1", "fieldPath": field}}
        return {"downwardAPI": {"items": [item]}}
    return {
        "configMap": {
            "name": CA_CONFIGMAP,
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
            "optional": True,
        }
    }


def push_volume(ca_from_annotation: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    volume = {
        "name": PUSH_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": PUSH_AUDIENCE,
                        "expirationSeconds": TOKEN_SECONDS,
                        "path": "token",
                    }
                },
                ca_source(ca_from_annotation),
            ]
        },
    }
    return volume, {"name": PUSH_VOLUME, "mountPath": PUSH_DIR, "readOnly": True}
