"""The pure part of localcluster.kubeflow_trainer: upstream webhook configurations pointed at a
local process by URL."""

from __future__ import annotations

import base64

from localcluster.kubeflow_trainer import webhooks_by_url

UPSTREAM = [
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "webhook-service"}},
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration", "annotations": {"x": "y"}},
        "webhooks": [
            {
                "name": "mpod.kb.io",
                "clientConfig": {
                    "service": {
                        "name": "webhook-service",
                        "namespace": "system",
                        "path": "/mutate--v1-pod",
                    }
                },
                "objectSelector": {"matchExpressions": [{"key": "k", "operator": "Exists"}]},
                "failurePolicy": "Fail",
            }
        ],
    },
]


def test_service_references_become_urls_with_our_ca() -> None:
    out = webhooks_by_url(UPSTREAM, "https://127.0.0.1:9443", b"CA")
    assert [d["kind"] for d in out] == ["MutatingWebhookConfiguration"]
    hook = out[0]["webhooks"][0]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    # What upstream selects and how it fails stay as upstream has them.
    assert hook["objectSelector"] == UPSTREAM[1]["webhooks"][0]["objectSelector"]
    assert hook["failurePolicy"] == "Fail"
    assert out[0]["metadata"] == {"name": "mutating-webhook-configuration"}
    assert "url" not in UPSTREAM[1]["webhooks"][0]["clientConfig"]  # the input is not changed
