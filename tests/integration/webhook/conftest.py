"""A `kubeckpt-webhook` process registered with the real API server by URL on 127.0.0.1
(localcluster.local_webhook), for the whole session; it answers /mutate only to the API server
(its client certificate, localcluster.admission_auth). It has a progress push CA file
(--progress-push-ca-file), as config/components/progress-push gives it; only pods whose policy sets
progress.push see it."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import LocalCluster, wait_for
from localcluster.local_webhook import (
    MWC_NAME,
    WEBHOOK_NS,
    WebhookProcess,
    local_webhook_configuration,
)
from reconciler.pki import make_ca

# Its own certificate Secret: the add-on installed on the real node (tests/node) uses the
# default one in the same namespace, with other SANs.
SESSION_SECRET = "kubeckpt-webhook-it-certs"
__all__ = ["MWC_NAME", "WEBHOOK_NS", "WebhookProcess", "local_webhook_configuration"]


@pytest.fixture(scope="session")
def push_ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The progress push endpoint's CA as the component mounts it into the webhook (ca.crt)."""
    now = dt.datetime.now(dt.UTC)
    pair = make_ca("kubeckpt-progress-ca", now=now, validity=dt.timedelta(days=1),
                   backdate=dt.timedelta(minutes=5))  # fmt: skip
    path = tmp_path_factory.mktemp("progress-ca") / "ca.crt"
    path.write_bytes(pair.cert_pem)
    return path


@pytest.fixture(scope="session")
def webhook(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, push_ca_file: Path
) -> Iterator[WebhookProcess]:
    # The port the API server presents its client certificate to: /mutate answers it alone.
    port = cluster.ports["kubeckpt_webhook"]
    cluster.kubectl("create", "namespace", WEBHOOK_NS, check=False)
    cluster.apply(local_webhook_configuration(port))
    proc = WebhookProcess(
        cluster,
        port,
        tmp_path_factory.mktemp("webhook") / "webhook.log",
        secret=SESSION_SECRET,
        client_ca=cluster.webhook_client_ca,
        extra_args=(f"--progress-push-ca-file={push_ca_file}",),
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()
        cluster.kubectl("delete", "mutatingwebhookconfiguration", MWC_NAME, check=False)


def dry_run_pod(cluster: LocalCluster, pod: dict) -> dict:
    """Create a pod with server-side dry run: admission (our webhook too) runs, nothing stored."""
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(pod)
    ).stdout
    return json.loads(out)


def wait_policy_seen(cluster: LocalCluster, namespace: str, probe: dict) -> None:
    """Wait until the webhook's cache has the namespace's policy (a dry-run pod gets injected)."""
    start = time.monotonic()
    wait_for(
        lambda: "kubeckpt.io/injected" in dry_run_pod(cluster, probe)["metadata"].get("labels", {}),
        "the webhook's cache to hold the new policy",
        timeout=20,
    )
    assert time.monotonic() - start < 20
