"""The progress push CA through the real API server: a push pod comes out of admission with the
webhook's CA in its annotation (a tenant's own value replaced) and a projected volume whose ca.crt
is that annotation (downward API), which the API server accepts as a Pod; no ConfigMap is needed
in the namespace (tests/unit/webhook: the fallback, pods without push, idempotence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcluster import LocalCluster
from tests.integration.webhook.conftest import WebhookProcess, dry_run_pod, wait_policy_seen
from tests.integration.webhook.test_injection import POLICY, probe_pod
from webhook.push_injection import PUSH_CA_ANNOTATION, PUSH_VOLUME

FIELD = f"metadata.annotations['{PUSH_CA_ANNOTATION}']"


@pytest.fixture
def push_ns(cluster: LocalCluster, namespace: str, webhook: WebhookProcess) -> str:
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/inject=enabled")
    spec = {**POLICY["spec"], "progress": {"push": True}}
    cluster.apply(
        {**POLICY, "metadata": {**POLICY["metadata"], "namespace": namespace}, "spec": spec}
    )
    wait_policy_seen(cluster, namespace, probe_pod(namespace))
    return namespace


def test_a_push_pod_trusts_the_webhooks_ca_from_its_own_annotation(
    cluster: LocalCluster, push_ns: str, push_ca_file: Path
) -> None:
    ca = push_ca_file.read_text()
    pod = probe_pod(push_ns)
    pod["metadata"]["annotations"] = {PUSH_CA_ANNOTATION: "-----BEGIN CERTIFICATE-----\nmine"}
    got = dry_run_pod(cluster, pod)  # the API server validated the patched pod
    assert got["metadata"]["annotations"][PUSH_CA_ANNOTATION] == ca
    volume = next(v for v in got["spec"]["volumes"] if v["name"] == PUSH_VOLUME)
    sources = volume["projected"]["sources"]
    assert [s["downwardAPI"]["items"] for s in sources if "downwardAPI" in s] == [
        [{"path": "ca.crt", "fieldRef": {"apiVersion": "v1", "fieldPath": FIELD}}]
    ]
    assert not any("configMap" in s for s in sources)
    configmaps = cluster.kubectl("get", "configmaps", "-n", push_ns, "-o", "name").stdout
    assert "kubeckpt-progress-ca" not in configmaps
