"""kubeckpt-webhook as a local process, registered with the API server by URL on 127.0.0.1.

The launcher the webhook's integration tests and hack/bench/webhook_bench.py share (one
definition; on the real node the add-on is installed from config/ instead, see addon.py).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from .cluster import LocalCluster
from .waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
MWC_NAME = "kubeckpt-webhook-it"
# A namespace with this label is served only by the add-on installed from config/ (tests/node).
ADDON_ONLY_LABEL = "kubeckpt.io/addon-only"
WEBHOOK_NS = "kubeckpt-system"


class WebhookProcess:
    def __init__(
        self,
        cluster: LocalCluster,
        port: int,
        log: Path,
        *,
        kubeconfig: Path | None = None,
        mwc_name: str = MWC_NAME,
        secret: str | None = None,
        client_ca: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.cluster = cluster
        self.port = port
        self.log = log
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.mwc_name = mwc_name
        self.secret = secret  # None: the webhook's default Secret name
        # The CA of the API server's client certificate (cluster.webhook_client_ca): /mutate then
        # answers the API server only. The API server presents it to 127.0.0.1 only on the port
        # it was started for (cluster.ports["kubeckpt_webhook"]).
        self.client_ca = client_ca
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        exe = shutil.which("kubeckpt-webhook", path=str(Path(sys.executable).parent))
        assert exe, "kubeckpt-webhook is not installed in the venv: run `make venv`"
        self.proc = subprocess.Popen(
            [
                exe,
                f"--kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--port={self.port}",
                f"--namespace={WEBHOOK_NS}",
                f"--webhook-config={self.mwc_name}",
                "--extra-ip=127.0.0.1",
                *([f"--secret={self.secret}"] if self.secret else []),
                *([f"--client-ca-file={self.client_ca}"] if self.client_ca else []),
                *self.extra_args,
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # readiness only; the API server verifies for real

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            with urllib.request.urlopen(f"{self.url}/readyz", context=ctx, timeout=2) as r:
                return r.status == 200

        wait_for(ready, "the webhook to be ready", timeout=30)
        wait_for(self.ca_published, "the caBundle in the webhook configuration", timeout=30)

    def ca_published(self) -> bool:
        mwc = json.loads(
            self.cluster.kubectl(
                "get", "mutatingwebhookconfiguration", self.mwc_name, "-o", "json"
            ).stdout
        )
        return all(w["clientConfig"].get("caBundle") for w in mwc["webhooks"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def local_webhook_configuration(port: int, name: str = MWC_NAME) -> dict:
    """config/webhook's configuration, registered by URL instead of through the Service."""
    mwc = yaml.safe_load(
        (REPO / "config" / "webhook" / "mutatingwebhookconfiguration.yaml").read_text()
    )
    mwc = copy.deepcopy(mwc)
    mwc["metadata"]["name"] = name
    for w in mwc["webhooks"]:
        path = w["clientConfig"]["service"]["path"]
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
        # Namespaces of the real-node tests belong to the add-on installed there, alone.
        w.setdefault("namespaceSelector", {}).setdefault("matchExpressions", []).append(
            {"key": ADDON_ONLY_LABEL, "operator": "DoesNotExist"}
        )
    return mwc
