"""Kueue beside the local control plane, run like Kubeflow Trainer (kubeflow_trainer.py): a host
process with the admin kubeconfig, its CRDs and webhook manifests from its own module (built by
hack/build-binaries.sh `build_kueue`), its admission webhooks registered by URL on loopback with
certificates from our own CA, its internal certificate manager off.

Only the integrations kubeckpt serves are on (`kubeflow.org/pytorchjob`,
`trainer.kubeflow.org/trainjob`), with the feature gate PriorityBoost (KEP-7990: Kueue reads
`kueue.x-k8s.io/priority-boost` on Workloads) and without the visibility API server (an
aggregated API that would need the cluster to route to it). Only the webhooks of Kueue's own
objects and of those two job kinds are registered: Kueue's pod, Deployment, StatefulSet and
batch Job webhooks (no-ops here) would otherwise sit in front of every pod of the other tests.

With internal certificate management off, Kueue v0.17 reads its metrics certificate at a fixed
path, /etc/kueue/metrics/certs, even when metrics are off; the process runs in a mount namespace
of its own where our certificate is bound there (an empty directory on the host is the mount
point). Root and unshare (util-linux) only, like Trainer's status server.
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import pki
from .binaries import MissingBinaries
from .kubeflow_trainer import webhooks_by_url
from .processes import free_port, wait_ready
from .waiting import wait_for

if TYPE_CHECKING:
    from .handle import ClusterHandle

KUEUE_NS = "kueue-system"
FRAMEWORKS = ("kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob")
FEATURE_GATES = {"PriorityBoost": True, "VisibilityOnDemand": False}
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # fixed in Kueue's cmd/kueue/main.go
# The webhooks registered: Kueue's own kinds, and the job kinds of FRAMEWORKS.
WEBHOOK_RESOURCES = {
    "kueue.x-k8s.io": None,  # every resource
    "kubeflow.org": {"pytorchjobs"},
    "trainer.kubeflow.org": {"trainjobs"},
}


class KueueUnavailable(RuntimeError):
    """Kueue cannot run on this machine (not root, no unshare) or was not built."""


def _rule_kept(rule: dict[str, Any]) -> bool:
    for group in rule.get("apiGroups") or []:
        if group not in WEBHOOK_RESOURCES:
            continue
        wanted = WEBHOOK_RESOURCES[group]
        resources = {r.split("/")[0] for r in rule.get("resources") or []}
        if wanted is None or resources & wanted:
            return True
    return False


def kept_webhooks(configurations: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The webhook configurations with only the webhooks of WEBHOOK_RESOURCES, renamed with a
    `kueue-` prefix (kubebuilder's default names are Trainer's and JobSet's too); a configuration
    left with no webhook is dropped."""
    out = []
    for conf in configurations:
        hooks = [
            h for h in conf.get("webhooks") or [] if any(map(_rule_kept, h.get("rules") or []))
        ]
        if not hooks:
            continue
        conf = {**conf, "webhooks": hooks, "metadata": {**conf["metadata"]}}
        conf["metadata"]["name"] = "kueue-" + conf["metadata"]["name"]
        out.append(conf)
    return out


def configuration(*, webhook_port: int, probe_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for the local process."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NS,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }


def feature_gates() -> str:
    return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(FEATURE_GATES.items()))


def queue_objects(
    namespace: str,
    *,
    cpu: str = "100",
    memory: str = "100Gi",
    priorities: dict[str, int] | None = None,
    queue: str = "lq",
) -> list[dict[str, Any]]:
    """What a namespace needs to submit jobs to Kueue: the ResourceFlavor `default-flavor`, a
    ClusterQueue `cq-<namespace>` with this quota whose higher-priority workloads preempt lower
    ones, its LocalQueue `queue` in `namespace`, and a WorkloadPriorityClass per `priorities`
    entry (name -> value; a job names one with the label kueue.x-k8s.io/priority-class)."""
    quota = [{"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": memory}]
    v = "kueue.x-k8s.io/v1beta2"
    return [
        {"apiVersion": v, "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}},
        *(
            {"apiVersion": v, "kind": "WorkloadPriorityClass", "metadata": {"name": n}, "value": x}
            for n, x in (priorities or {}).items()
        ),
        {
            "apiVersion": v,
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{namespace}"},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [{"name": "default-flavor", "resources": quota}],
                    }
                ],
            },
        },
        {
            "apiVersion": v,
            "kind": "LocalQueue",
            "metadata": {"name": queue, "namespace": namespace},
            "spec": {"clusterQueue": f"cq-{namespace}"},
        },
    ]


class KueueStack:
    """Kueue for one LocalCluster: `start()` (idempotent), `restart()`, `stop()`."""

    def __init__(self, cluster: ClusterHandle) -> None:
        self.cluster = cluster
        self._prepared = False
        self._webhooks: list[tuple[str, str]] = []

    @property
    def started(self) -> bool:
        proc = self.cluster.procs.get("kueue")
        return proc is not None and proc.alive()

    def _dir(self) -> Path:
        assert self.cluster.workdir is not None
        return self.cluster.workdir / "kueue"

    def _prepare(self) -> None:
        c = self.cluster
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            raise KueueUnavailable(
                "Kueue needs root and unshare (util-linux) here: it reads its metrics "
                f"certificate at {METRICS_CERT_DIR}"
            )
        d = self._dir()
        d.mkdir(exist_ok=True)
        for name in ("kueue_webhook", "kueue_probe"):
            c.ports[name] = free_port()
        ca = pki.make_ca("kubeckpt-kueue-ca")
        ca.write(d, "ca")
        pki.issue(ca, "kueue", ips=("127.0.0.1",), server=True).write(d, "kueue")
        certs = d / "certs"
        certs.mkdir(exist_ok=True)
        for name in ("crt", "key"):
            shutil.copy(d / f"kueue.{name}", certs / f"tls.{name}")
        (d / "config.yaml").write_text(
            yaml.safe_dump(
                configuration(
                    webhook_port=c.ports["kueue_webhook"],
                    probe_port=c.ports["kueue_probe"],
                    cert_dir=certs,
                )
            )
        )
        self._prepared = True

    def _apply_manifests(self, manifests: Path) -> None:
        c = self.cluster
        args = [
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=kubeckpt-localcluster",
        ]
        for f in sorted(manifests.glob("crds/*.yaml")):
            args += ["-f", str(f)]
        c.kubectl(*args)

        # Polled: `kubectl wait` fails at once while the new CRD has no status yet.
        def established() -> bool:
            out = c.kubectl(
                "get", "crd", "workloads.kueue.x-k8s.io", "-o",
                "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                check=False,
            )  # fmt: skip
            return out.stdout.strip() == "True"

        wait_for(established, "Kueue's Workload CRD to be Established", timeout=60)
        rendered = yaml.safe_load_all(c.kubectl("kustomize", str(manifests / "webhook")).stdout)
        ca_pem = (self._dir() / "ca.crt").read_bytes()
        hooks = webhooks_by_url(
            kept_webhooks(d for d in rendered if d),
            f"https://127.0.0.1:{c.ports['kueue_webhook']}",
            ca_pem,
        )
        self._webhooks = [(h["kind"], h["metadata"]["name"]) for h in hooks]
        c.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NS}}, *hooks])

    def start(self) -> None:
        c = self.cluster
        if self.started:
            return
        assert c.binaries is not None
        binary, manifests = c.binaries.require_kueue()
        t0 = time.monotonic()
        if not self._prepared:
            self._prepare()
        if not self._webhooks:
            self._apply_manifests(manifests)
        d = self._dir()
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)  # the mount point, on the host
        script = f'set -e; mount --bind {d / "certs"} {METRICS_CERT_DIR}; exec "$@"'
        argv = [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            str(binary),
            f"--config={d / 'config.yaml'}",
            f"--feature-gates={feature_gates()}",
            "--zap-log-level=2",
        ]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(c.kubeconfig), "TMPDIR": str(d)}
        proc = c._spawn("kueue", argv, env=env)
        url = f"http://127.0.0.1:{c.ports['kueue_probe']}/readyz"

        def ready() -> bool:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200

        wait_ready("kueue readiness", proc, ready, 90)
        c.timings["kueue_start"] = time.monotonic() - t0

    def restart(self) -> None:
        """Stop the process and start it again, webhooks left in place (a restart mid-run)."""
        if "kueue" in self.cluster.procs:
            self.cluster.procs.pop("kueue").stop()
        self.start()

    def stop(self) -> None:
        """Stop Kueue and remove its webhook configurations (failurePolicy Fail: left behind,
        they would refuse every Workload and job of the two kinds); CRDs and objects stay."""
        if "kueue" in self.cluster.procs:
            self.cluster.procs.pop("kueue").stop()
        for kind, name in self._webhooks:
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        self._webhooks = []


__all__ = ["KueueStack", "KueueUnavailable", "MissingBinaries", "kept_webhooks", "queue_objects"]
