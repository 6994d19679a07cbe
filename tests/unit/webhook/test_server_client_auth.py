"""The webhook with client-certificate authentication of the API server (--client-ca-file): a
forged AdmissionReview from a client without the API server's certificate is refused before
anything is looked up, and its answer holds nothing of the namespace. (The TLS side, with real
certificates: tests/unit/reconciler/test_client_auth.py; with the real API server:
tests/integration/webhook/test_forged_review.py.)"""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from localcluster import pki
from reconciler.admission import ClientCertAuth, ServingTLS
from tests.support.operator_pods import operator_pod
from tests.unit.webhook.test_server import review
from webhook.main import parse_args
from webhook.server import Metrics, make_app
from webhook.view import StaticView

NS = {"metadata": {"name": "team-b", "labels": {"kubeckpt.io/inject": "enabled"}}}
SECRETS = ["secret-claim", "team-b-s3-creds", "team-b-policy", "s3://team-b-bucket"]
POLICY = {
    "metadata": {"name": "team-b-policy", "namespace": "team-b"},
    "spec": {"storage": {"uri": "s3://team-b-bucket/x", "secretRef": {"name": "team-b-s3-creds"}}},
}


class CountingView(StaticView):
    looked_up = 0

    def policies(self, namespace: str) -> list:
        self.looked_up += 1
        return super().policies(namespace)


async def test_a_forged_review_is_refused_and_reveals_nothing() -> None:
    tls = ServingTLS()
    tls.load_client_ca(pki.make_ca("apiserver-client-ca").cert_pem)
    view = CountingView(namespaces=[NS], policies=[POLICY])
    metrics = Metrics()
    app = make_app(view, metrics=metrics, client_auth=ClientCertAuth(tls))
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/mutate", json=review(operator_pod("PyTorchJob", "j", "team-b")))
        body = await resp.text()
        assert (await client.get("/readyz")).status == 200
        metrics_text = await (await client.get("/metrics")).text()
    assert resp.status == 401 and "client certificate is required" in body
    assert not any(s in body for s in SECRETS)
    assert view.looked_up == 0  # refused before any policy lookup
    assert 'kubeckpt_webhook_requests_total{result="unauthorized"} 1.0' in metrics_text


async def test_not_ready_until_the_client_ca_is_loaded() -> None:
    tls = ServingTLS()
    app = make_app(StaticView(), client_auth=ClientCertAuth(tls))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/readyz")
        assert resp.status == 503 and "no client CA" in await resp.text()
        tls.load_client_ca(pki.make_ca("ca").cert_pem)
        assert (await client.get("/readyz")).status == 200


def test_flags(tmp_path: Path) -> None:
    args = parse_args(
        [
            f"--client-ca-file={tmp_path / 'ca.crt'}",
            "--client-allowed-names=kube-apiserver",
            "--client-allowed-names=apiserver-webhook-client",
        ]
    )
    assert args.client_ca_file == tmp_path / "ca.crt"
    assert args.client_allowed_names == ["kube-apiserver", "apiserver-webhook-client"]
    assert parse_args([]).client_ca_file is None
