"""The pure parts of localcluster.kueue: which of Kueue's webhooks the local cluster registers,
and the configuration its process runs with."""

from __future__ import annotations

from pathlib import Path

from localcluster.kueue import FRAMEWORKS, configuration, feature_gates, kept_webhooks


def _hook(name: str, group: str, resource: str) -> dict:
    return {
        "name": name,
        "clientConfig": {"service": {"name": "webhook-service", "path": f"/{name}"}},
        "rules": [{"apiGroups": [group], "resources": [resource], "operations": ["CREATE"]}],
    }


UPSTREAM = [
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            _hook("mpod.kb.io", "", "pods"),
            _hook("mjob.kb.io", "batch", "jobs"),
            _hook("mpytorchjob.kb.io", "kubeflow.org", "pytorchjobs"),
            _hook("mtfjob.kb.io", "kubeflow.org", "tfjobs"),
            _hook("mtrainjob.kb.io", "trainer.kubeflow.org", "trainjobs"),
            _hook("mworkload.kb.io", "kueue.x-k8s.io", "workloads"),
        ],
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            _hook("vworkload.kb.io", "kueue.x-k8s.io", "workloads"),
            _hook("vworkloadstatus.kb.io", "kueue.x-k8s.io", "workloads/status"),
            _hook("vclusterqueue.kb.io", "kueue.x-k8s.io", "clusterqueues"),
        ],
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "pods-only"},
        "webhooks": [_hook("vpod.kb.io", "", "pods")],
    },
]


def test_only_kueues_own_and_the_served_job_kinds_webhooks_are_kept() -> None:
    kept = kept_webhooks(UPSTREAM)
    names = {c["metadata"]["name"]: [h["name"] for h in c["webhooks"]] for c in kept}
    assert names == {
        "kueue-mutating-webhook-configuration": [
            "mpytorchjob.kb.io",
            "mtrainjob.kb.io",
            "mworkload.kb.io",
        ],
        "kueue-validating-webhook-configuration": [
            "vworkload.kb.io",
            "vworkloadstatus.kb.io",
            "vclusterqueue.kb.io",
        ],
    }
    # The input is not changed.
    assert UPSTREAM[0]["metadata"]["name"] == "mutating-webhook-configuration"
    assert len(UPSTREAM[0]["webhooks"]) == 6


def test_the_configuration_serves_the_two_job_kinds_locally() -> None:
    conf = configuration(webhook_port=9443, probe_port=8081, cert_dir=Path("/x/certs"))
    assert conf["integrations"] == {"frameworks": list(FRAMEWORKS)}
    assert FRAMEWORKS == ("kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob")
    assert conf["webhook"] == {"port": 9443, "host": "127.0.0.1", "certDir": "/x/certs"}
    assert conf["health"] == {"healthProbeBindAddress": "127.0.0.1:8081"}
    assert conf["internalCertManagement"] == {"enable": False}
    assert conf["leaderElection"] == {"leaderElect": False}
    assert feature_gates() == "PriorityBoost=true,VisibilityOnDemand=false"
