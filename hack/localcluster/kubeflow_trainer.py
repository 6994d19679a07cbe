"""Kubeflow Trainer v2 and JobSet beside the local control plane, run like the training-operator.

Both controllers run as host processes with the admin kubeconfig; their admission webhooks are
registered by URL on loopback (rendered from the manifests in their own modules with `kubectl
kustomize`, then pointed at the process), with certificates from our own CA, and their internal
certificate managers are off. Trainer's `torch-distributed` ClusterTrainingRuntime is installed
from its module, with the node image our real node has.

Trainer's status server (feature gate TrainJobStatus) is what `KubeflowCallback` in a pod posts to:
Trainer injects `https://kubeflow-trainer-controller-manager.kubeflow-system.svc:<port>` into the
`node` containers. Here that Service has no selector and one endpoint, the node's address, where
the process listens; the node's INPUT guard admits only loopback and the bridge to that port.
The server reads its certificate and an in-cluster service-account token (whose issuer leads it to
the keys that verify pods' tokens) at fixed in-pod paths: with the gate on, Trainer runs in a mount
namespace of its own that has them, leaving the host's paths alone (root only, like the node).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import pki
from .images import IMAGES
from .node import NODE_IP, NodeUnavailable
from .processes import ClusterError, free_port, wait_ready
from .waiting import wait_for

if TYPE_CHECKING:
    from .handle import ClusterHandle

# Trainer reads its namespace from the service-account mount and falls back to this one.
TRAINER_NS = "kubeflow-system"
TRAINER_SERVICE = "kubeflow-trainer-controller-manager"
TRAINER_SECRET = "kubeflow-trainer-webhook-cert"
JOBSET_NS = "jobset-system"
STATUS_GATE = "TrainJobStatus"
# Fixed in Trainer's pkg/util/cert (the status server's certificate watcher).
STATUS_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
# Where Trainer's status server reads the in-cluster token (its issuer; /var/run is /run).
SA_DIR = "/run/secrets/kubernetes.io/serviceaccount"
RUNTIME = "torch-distributed"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def webhooks_by_url(docs: list[dict[str, Any]], url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """Webhook configurations with each Service reference replaced by `url` + its path."""
    out = []
    for doc in docs:
        if not doc.get("kind", "").endswith("WebhookConfiguration"):
            continue
        doc = json.loads(json.dumps(doc))
        for hook in doc.get("webhooks") or []:
            cc = hook.get("clientConfig") or {}
            path = (cc.get("service") or {}).get("path", "")
            hook["clientConfig"] = {"url": url + path, "caBundle": _b64(ca_pem)}
            hook["timeoutSeconds"] = 10
        doc["metadata"] = {"name": doc["metadata"]["name"]}
        out.append(doc)
    return out


class TrainerStack:
    """JobSet and Trainer for one LocalCluster; `start(status_gate=...)` (re)starts Trainer with
    that gate setting, `stop()` stops both."""

    def __init__(self, cluster: ClusterHandle) -> None:
        self.cluster = cluster
        self.status_gate: bool | None = None
        self.status_limits: tuple[float, int] | None = None
        self._prepared = False
        self._webhooks: list[tuple[str, str]] = []

    @property
    def started(self) -> bool:
        return self.status_gate is not None

    @property
    def status_port(self) -> int:
        return self.cluster.ports["trainer_status"]

    # --- set-up: certificates and ports once, manifests at every start ---
    def _prepare(self) -> None:
        c = self.cluster
        assert c.workdir is not None and c.binaries is not None
        d = c.workdir / "trainer"
        d.mkdir(exist_ok=True)
        for name in ("jobset_webhook", "jobset_probe", "trainer_webhook", "trainer_probe"):
            c.ports[name] = free_port()
        c.ports["trainer_status"] = free_port()
        ca = pki.make_ca("kubeckpt-kubeflow-ca")
        ca.write(d, "ca")
        trainer_dns = f"{TRAINER_SERVICE}.{TRAINER_NS}.svc"
        pki.issue(ca, "jobset", ips=("127.0.0.1",), server=True).write(d, "jobset")
        pki.issue(ca, trainer_dns, dns_names=(trainer_dns,), ips=("127.0.0.1",), server=True).write(
            d, "trainer"
        )
        for name in ("jobset", "trainer"):
            certs = d / f"{name}-tmp" / "k8s-webhook-server" / "serving-certs"
            certs.mkdir(parents=True)
            shutil.copy(d / f"{name}.crt", certs / "tls.crt")
            shutil.copy(d / f"{name}.key", certs / "tls.key")
        (d / "jobset.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                    "kind": "Configuration",
                    "leaderElection": {"leaderElect": False},
                    "internalCertManagement": {"enable": False},
                    "webhook": {
                        "port": c.ports["jobset_webhook"],
                        "host": "127.0.0.1",
                        "certDir": str(d / "jobset-tmp" / "k8s-webhook-server" / "serving-certs"),
                    },
                    "health": {"healthProbeBindAddress": f"127.0.0.1:{c.ports['jobset_probe']}"},
                    "metrics": {"bindAddress": "0"},
                }
            )
        )
        self._prepared = True

    def _apply_manifests(self) -> None:
        """CRDs (JobSet's and Trainer's; a test may have replaced or deleted them since the last
        start), the webhook configurations, Trainer's Secret and the status server's Service."""
        c = self.cluster
        assert c.workdir is not None and c.binaries is not None
        d = c.workdir / "trainer"
        built = c.binaries.require_trainer()
        files = sorted(built.jobset_manifests.glob("crds/*.yaml"))
        files += sorted(built.trainer_manifests.glob("crds/*.yaml"))
        args = [
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=kubeckpt-localcluster",
        ]
        for f in files:
            args += ["-f", str(f)]
        c.kubectl(*args)
        for crd in ("jobsets.jobset.x-k8s.io", "trainjobs.trainer.kubeflow.org"):
            c.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
        ca_pem = (d / "ca.crt").read_bytes()
        hooks = webhooks_by_url(
            self._render(built.jobset_manifests / "webhook"),
            f"https://127.0.0.1:{c.ports['jobset_webhook']}",
            ca_pem,
        )
        hooks += webhooks_by_url(
            self._render(built.trainer_manifests / "webhook"),
            f"https://127.0.0.1:{c.ports['trainer_webhook']}",
            ca_pem,
        )
        # JobSet's and Trainer's configurations share kubebuilder's default names: make them
        # distinct, as their kustomize name prefixes do.
        for h in hooks:
            first = h["webhooks"][0]["name"]
            if first.endswith(".kb.io"):
                h["metadata"]["name"] = "jobset-" + h["metadata"]["name"]
        self._webhooks = [(h["kind"], h["metadata"]["name"]) for h in hooks]
        c.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                for ns in (TRAINER_NS, JOBSET_NS)
            ]
            + [
                # Trainer copies ca.crt from here into each TrainJob's status-server ConfigMap.
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": TRAINER_SECRET, "namespace": TRAINER_NS},
                    "data": {
                        "ca.crt": _b64(ca_pem),
                        "tls.crt": _b64((d / "trainer.crt").read_bytes()),
                        "tls.key": _b64((d / "trainer.key").read_bytes()),
                    },
                },
                *hooks,
            ]
        )
        if c.node is not None:
            self._status_service()

    def _render(self, directory: Path) -> list[dict[str, Any]]:
        out = self.cluster.kubectl("kustomize", str(directory)).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

    def _status_service(self) -> None:
        """The Service Trainer puts in pods' KUBEFLOW_TRAINER_SERVER_URL, at the host process."""
        port = self.status_port
        self.cluster.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": TRAINER_SERVICE, "namespace": TRAINER_NS},
                    "spec": {"ports": [{"name": "status-server", "port": port}]},
                },
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": f"{TRAINER_SERVICE}-host",
                        "namespace": TRAINER_NS,
                        "labels": {"kubernetes.io/service-name": TRAINER_SERVICE},
                    },
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
                    "ports": [{"name": "status-server", "port": port, "protocol": "TCP"}],
                },
            ]
        )
        node = self.cluster.node
        assert node is not None
        if port not in node.guarded_ports:
            node.guard_host_port(port)

    # --- processes ---
    def start(
        self, *, status_gate: bool = False, status_qps: float = 5.0, status_burst: int = 10
    ) -> None:
        """Start JobSet and Trainer (Trainer with TrainJobStatus=`status_gate`, its status
        server's API client at `status_qps`/`status_burst`: Trainer's defaults unless a benchmark
        asks); restart Trainer when it runs with other settings."""
        c = self.cluster
        limits = (status_qps, status_burst)
        if (
            self.status_gate == status_gate
            and self.status_limits == limits
            and c.procs["trainer"].alive()
        ):
            return
        t0 = time.monotonic()
        if not self._prepared:
            self._prepare()
        if self.status_gate is None:
            self._apply_manifests()
        assert c.workdir is not None and c.binaries is not None
        d = c.workdir / "trainer"
        if "jobset" not in c.procs or not c.procs["jobset"].alive():
            c._spawn(
                "jobset",
                [
                    str(c.binaries.require_trainer().jobset),
                    f"--kubeconfig={c.kubeconfig}",
                    f"--config={d / 'jobset.yaml'}",
                    "--zap-log-level=info",
                ],
                env={**os.environ, "TMPDIR": str(d / "jobset-tmp")},
            )
            self._wait_ready("jobset", c.ports["jobset_probe"])
        if "trainer" in c.procs:
            c.procs.pop("trainer").stop()
        (d / "trainer.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                    "kind": "Configuration",
                    "health": {
                        "healthProbeBindAddress": f"127.0.0.1:{c.ports['trainer_probe']}",
                        "readinessEndpointName": "readyz",
                        "livenessEndpointName": "healthz",
                    },
                    "metrics": {"bindAddress": "0"},
                    "webhook": {"port": c.ports["trainer_webhook"], "host": "127.0.0.1"},
                    "leaderElection": {"leaderElect": False},
                    "certManagement": {
                        "enable": False,
                        "webhookServiceName": TRAINER_SERVICE,
                        "webhookSecretName": TRAINER_SECRET,
                    },
                    "statusServer": {
                        "port": self.status_port,
                        "qps": status_qps,
                        "burst": status_burst,
                    },
                    "featureGates": {STATUS_GATE: status_gate},
                }
            )
        )
        argv = [
            str(c.binaries.require_trainer().trainer),
            f"--kubeconfig={c.kubeconfig}",
            f"--config={d / 'trainer.yaml'}",
            f"--feature-gates={STATUS_GATE}={str(status_gate).lower()}",
        ]
        if status_gate:
            argv = self._in_pod_like_mounts(argv)
        c._spawn("trainer", argv, env={**os.environ, "TMPDIR": str(d / "trainer-tmp")})
        self._wait_ready("trainer", c.ports["trainer_probe"])
        self._install_runtime()
        self.status_gate = status_gate
        self.status_limits = limits
        c.timings["trainer_start"] = time.monotonic() - t0

    def _in_pod_like_mounts(self, argv: list[str]) -> list[str]:
        """`argv` in a mount namespace of its own that has what Trainer's status server reads at
        fixed paths in its pod: a service-account token (its issuer is how the server finds the
        keys to verify pods' tokens with) and its serving certificate. The host's /run and
        /tmp/k8s-webhook-server stay untouched. Needs root, and an issuer the host can discover:
        the real node's address, or the loopback one a KWOK-only cluster can be asked for."""
        c = self.cluster
        assert c.workdir is not None
        if c.node is None and not c.loopback_issuer:
            raise NodeUnavailable(
                "Trainer's TrainJobStatus gate needs the real node (its status server is reached "
                "by pods, and verifies their tokens against the API server's node-address issuer)"
            )
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            raise NodeUnavailable(
                "Trainer's TrainJobStatus gate needs root and unshare (util-linux) here"
            )
        d = c.workdir / "trainer"
        sa = d / "serviceaccount"
        sa.mkdir(exist_ok=True)
        c.kubectl("create", "serviceaccount", TRAINER_SERVICE, "-n", TRAINER_NS, check=False)
        token = c.kubectl(
            "create", "token", TRAINER_SERVICE, "-n", TRAINER_NS, "--duration=24h"
        ).stdout.strip()
        (sa / "token").write_text(token)
        (sa / "namespace").write_text(TRAINER_NS)
        certs = d / "status-certs"
        certs.mkdir(exist_ok=True)
        for name in ("crt", "key"):
            shutil.copy(d / f"trainer.{name}", certs / f"tls.{name}")
        STATUS_CERT_DIR.mkdir(parents=True, exist_ok=True)  # the mount point, on the host
        script = (
            "set -e; mount -t tmpfs -o size=1m tmpfs /run; "
            f"mkdir -p {SA_DIR}; cp {sa}/token {sa}/namespace {SA_DIR}/; "
            f"mount --bind {certs} {STATUS_CERT_DIR}; "
            'exec "$@"'
        )
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv]

    def _wait_ready(self, name: str, port: int) -> None:
        url = f"http://127.0.0.1:{port}/readyz"

        def ready() -> bool:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200

        wait_ready(f"{name} readiness", self.cluster.procs[name], ready, 60)

    def _install_runtime(self) -> None:
        """torch-distributed from Trainer's module, with the node's training image (the upstream
        CUDA image cannot be pulled here)."""
        c = self.cluster
        assert c.binaries is not None
        manifests = c.binaries.require_trainer().trainer_manifests
        runtime = yaml.safe_load((manifests / "runtimes" / "torch_distributed.yaml").read_text())
        for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            for ctr in rj["template"]["spec"]["template"]["spec"]["containers"]:
                ctr["image"] = IMAGES["training"]
                ctr.setdefault("imagePullPolicy", "Never")

        # The validating webhook may still be warming up right after readiness.
        def applied() -> bool:
            try:
                c.apply(runtime)
            except ClusterError:
                return False
            return True

        wait_for(applied, f"the {RUNTIME} ClusterTrainingRuntime", timeout=30)

    def stop(self) -> None:
        """Stop both, and remove their webhook configurations (failurePolicy Fail: left behind,
        they would refuse every TrainJob and JobSet); the next start applies them again."""
        for name in ("trainer", "jobset"):
            if name in self.cluster.procs:
                self.cluster.procs.pop(name).stop()
        for kind, name in self._webhooks:
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        self._webhooks = []
        self.status_gate = None
        self.status_limits = None
