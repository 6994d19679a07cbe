"""/mutate answers the API server alone (issue 24, item 2): the session's webhook verifies client
certificates against the CA that signed the local API server's (localcluster.admission_auth). A
forged AdmissionReview for another namespace, sent straight to the webhook without that
certificate, is refused and returns none of the namespace's data; with a certificate of another
CA (the cluster admin's) the handshake fails; pods created through the API server are still
injected."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.request
import uuid

import pytest

from localcluster import LocalCluster, admission_auth, pki
from reconciler.pem_files import pem_paths
from tests.integration.webhook.conftest import WebhookProcess, dry_run_pod, wait_policy_seen
from tests.support.operator_pods import operator_pod

SECRET, BUCKET, POLICY = "team-b-object-store", "team-b-bucket", "team-b-policy"
REFUSED = (OSError, http.client.HTTPException)  # a TLS alert, a reset, a closed connection


def forged_review(namespace: str) -> bytes:
    pod = operator_pod("PyTorchJob", "llama", namespace)
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": namespace,
                "object": pod,
            },
        }
    ).encode()


def post(webhook: WebhookProcess, body: bytes, cert: pki.KeyPair | None) -> tuple[int, str]:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the client is what is tested
    if cert is not None:
        with pem_paths(cert.cert_pem, cert.key_pem) as (crt, key):
            ctx.load_cert_chain(crt, key)
    req = urllib.request.Request(
        webhook.url + "/mutate", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def other_tenant(cluster: LocalCluster, namespace: str, webhook: WebhookProcess) -> str:
    """An opted-in namespace whose policy names a bucket and a Secret."""
    cluster.kubectl("label", "namespace", namespace, "kubeckpt.io/inject=enabled")
    cluster.apply(
        {
            "apiVersion": "kubeckpt.io/v1alpha1",
            "kind": "CheckpointPolicy",
            "metadata": {"name": POLICY, "namespace": namespace},
            "spec": {"storage": {"uri": f"s3://{BUCKET}/runs", "secretRef": {"name": SECRET}}},
        }
    )
    # through the API server, which presents its certificate: injected
    wait_policy_seen(cluster, namespace, operator_pod("PyTorchJob", "probe", namespace))
    return namespace


def test_a_forged_review_without_the_api_servers_certificate_reveals_nothing(
    cluster: LocalCluster, other_tenant: str, webhook: WebhookProcess
) -> None:
    body = forged_review(other_tenant)
    status, answer = post(webhook, body, None)
    assert status == 401, answer
    assert "client certificate is required" in answer
    for secret in (BUCKET, SECRET, POLICY, other_tenant, "CHECKPOINT_URI", "patch"):
        assert secret not in answer, secret


def test_a_certificate_of_another_ca_fails_the_handshake(
    cluster: LocalCluster, other_tenant: str, webhook: WebhookProcess
) -> None:
    assert cluster.workdir is not None
    body = forged_review(other_tenant)
    # the cluster admin's certificate: signed by the cluster's CA, not the webhook client CA
    admin = pki.KeyPair.read(cluster.workdir / "pki", "admin")
    with pytest.raises(REFUSED):
        post(webhook, body, admin)
    stranger = pki.issue(pki.make_ca("stranger"), admission_auth.CLIENT_CN, client=True)
    with pytest.raises(REFUSED):
        post(webhook, body, stranger)


def test_the_api_servers_certificate_is_answered_and_pods_are_injected(
    cluster: LocalCluster, other_tenant: str, webhook: WebhookProcess
) -> None:
    """The control: the same review with the API server's own certificate gets the patch (so the
    refusals above are the authentication's), and a pod created through the API server is
    injected."""
    assert cluster.workdir is not None
    apiserver = pki.KeyPair.read(cluster.workdir / "pki", admission_auth.CLIENT_NAME)
    status, answer = post(webhook, forged_review(other_tenant), apiserver)
    assert status == 200 and json.loads(answer)["response"]["patchType"] == "JSONPatch"
    got = dry_run_pod(cluster, operator_pod("PyTorchJob", "llama", other_tenant))
    env = {e["name"]: e for e in got["spec"]["containers"][0]["env"]}
    assert env["CHECKPOINT_URI"]["value"] == f"s3://{BUCKET}/runs/{other_tenant}/llama"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == SECRET
