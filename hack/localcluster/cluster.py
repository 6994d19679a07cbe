"""A real local Kubernetes control plane, run as plain processes (the envtest way, plus more).

etcd, kube-apiserver (client-certificate and service-account-token authentication, RBAC), the
controller-manager (garbage collection, namespaces, service accounts and their tokens), the
scheduler, KWOK (fake nodes that the scheduler binds pods to, pod lifecycle, and pod exec served as
local processes), and the real Kubeflow training-operator with its validating webhooks. Our CRDs,
the training-operator's and KWOK's Exec CRDs are installed. Everything listens on loopback ports
and lives in one temporary directory that `stop()` removes.

Every child is started with PR_SET_PDEATHSIG, so even a SIGKILLed test run leaves no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import admission_auth, pki
from .binaries import Binaries, ensure_binaries
from .images import IMAGES
from .kubeconfig import write_kubeconfig
from .kubeflow_trainer import TrainerStack
from .kueue import KueueStack
from .node import (
    MAX_REAL_NODES,
    NODE_IP,
    REAL_NODE_TAINT,
    NodeUnavailable,
    RealNode,
    sweep_stale_real_node,
)
from .processes import ClusterError, Process, free_port, wait_ready
from .seaweedfs import SeaweedFS
from .waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
OUR_CRDS = REPO / "config" / "crd" / "bases"
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"
POD_CIDR = "10.244.0.0/16"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT = {"key": KWOK_NODE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
TRAINING_OPERATOR_NS = "kubeflow"
# The training-operator's cert rotator checks this fixed path for the mounted certificate.
TRAINING_OPERATOR_ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")

# Our own taints; a node that carries one of them is still "ready" for the start-up check.
ALLOWED_TAINTS = (KWOK_TAINT, REAL_NODE_TAINT)
REAL_NODE_CONTROLLERS = (
    ",deployment,replicaset,endpoint,endpointslice,endpointslicemirroring,job,disruption,"
    "podgc,statefulset,daemonset,ttl-after-finished,pv-protection,pvc-protection"
)


WORKDIR_PREFIX = "kubeckpt-cluster-"
# KWOK's bundled pod-complete stage completes every Running pod that a batch Job owns, at once, as
# a batch workload would. A TrainJob's training pods are a batch Job's (pod -> Job -> JobSet ->
# TrainJob) yet run until stopped: a pod with this annotation stays Running, so that tests can
# read its progress by exec, as they do a PyTorchJob's pods (which no Job owns).
KWOK_KEEP_RUNNING_ANNOTATION = "kubeckpt.io/kwok-keep-running"


def kwok_stages(texts: Sequence[str]) -> str:
    """KWOK's stage documents as one config, pod-complete sparing pods that keep running."""
    docs = [doc for text in texts for doc in yaml.safe_load_all(text) if doc]
    for doc in docs:
        if doc.get("kind") == "Stage" and doc["metadata"]["name"] == "pod-complete":
            doc["spec"]["selector"].setdefault("matchExpressions", []).append(
                {
                    "key": f'.metadata.annotations["{KWOK_KEEP_RUNNING_ANNOTATION}"]',
                    "operator": "DoesNotExist",
                }
            )
    return yaml.safe_dump_all(docs)


def sweep_stale_workdirs(tmp: Path | None = None) -> list[Path]:
    """Remove work directories left by clusters whose owning process is gone (a SIGKILLed run).

    Their processes died with their owner (PR_SET_PDEATHSIG); only the files remain.
    """
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        try:
            pid = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


@dataclass
class LocalCluster:
    """Start with `start()`, stop with `stop()`; or use as a context manager."""

    nodes: int = 3
    # Real nodes (node.py: containerd, kubelet, kube-proxy, CoreDNS on the host): 0, 1 or more.
    # Node 0 starts with the cluster (or on first use); the others after it (`add_real_node`).
    real_nodes: int = 0
    # Taint the real node so that only pods that tolerate it land there (the test session, where
    # KWOK-based tests must keep their pods on KWOK nodes).
    taint_real_nodes: bool = False
    # Taint the KWOK nodes (KWOK's own convention), so that workloads of `make cluster-up` and the
    # demo run on the real node, where containers really run.
    taint_kwok_nodes: bool = False
    # The test session: a machine that cannot run a real node still runs the KWOK tests (the
    # reason is kept in `real_node_problem`), and the node starts on first use
    # (`start_real_node`), so that only the tests that need it wait for its images.
    real_node_optional: bool = False
    defer_real_node: bool = False
    # Without a real node: the tokens' issuer is the API server's loopback address, so that OIDC
    # discovery of it works from the host (Trainer's status server, run with the TrainJobStatus
    # gate by the push benchmark). Off by default: the in-cluster name, as before.
    loopback_issuer: bool = False
    binaries: Binaries | None = None
    workdir: Path | None = None
    keep_workdir: bool = False
    procs: dict[str, Process] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    # --- paths and addresses ---
    @property
    def kubeconfig(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def __post_init__(self) -> None:
        self.ports: dict[str, int] = {}
        self.node: RealNode | None = None
        self.further_nodes: list[RealNode] = []  # real nodes 1, 2, ... (add_real_node)
        self.trainer = TrainerStack(self)
        self.kueue = KueueStack(self)
        self.seaweedfs: SeaweedFS | None = None
        self.real_node_problem: str | None = None
        if not 0 <= self.real_nodes <= MAX_REAL_NODES:
            raise ValueError(f"0 to {MAX_REAL_NODES} real nodes")

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle ---
    def start(self) -> None:
        t0 = time.monotonic()
        if self.binaries is None:
            self.binaries = ensure_binaries()
        self.timings["binaries"] = time.monotonic() - t0
        t_start = time.monotonic()
        if self.real_nodes:
            sweep_stale_real_node()  # before its work dir goes, so its mounts are undone first
        sweep_stale_workdirs()
        self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        (self.workdir / "logs").mkdir()
        # kubeckpt_webhook: the local webhook process's (local_webhook.py), fixed before the API
        # server starts, which reads the host it presents its client certificate to only then.
        for name in (
            "etcd",
            "etcd_peer",
            "apiserver",
            "kwok",
            "operator_webhook",
            "kubeckpt_webhook",
        ):
            self.ports[name] = free_port()
        try:
            self._pki()
            if self.real_nodes:
                node = RealNode(self, taint=self.taint_real_nodes)
                try:
                    node.prepare()
                    self.node = node
                except NodeUnavailable as e:
                    if not self.real_node_optional:
                        raise
                    self.real_node_problem = str(e)
            self._start_etcd()
            self._start_apiserver()
            self.timings["apiserver_ready"] = time.monotonic() - t_start
            # CRDs first, so KWOK's Exec informer finds its resource at once instead of backing off.
            self._install_crds()
            self._start_controllers()
            self._start_training_operator()
            self._create_nodes()
            self._wait_ready()
            if self.node is not None and not self.defer_real_node:
                self.start_real_node()
                for _ in range(1, self.real_nodes):
                    self.add_real_node()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t_start
        (self.workdir / "cluster.json").write_text(json.dumps(self.describe(), indent=2))

    def start_real_node(self) -> RealNode:
        """Start the real node prepared by `start()` (once; later calls return it)."""
        if self.node is None:
            raise NodeUnavailable(self.real_node_problem or "this cluster has no real node")
        if not self.node.started:
            try:
                self.node.start()
            except Exception as e:
                self.real_node_problem = f"the real node failed to start: {e}"
                raise
            self.timings.update({f"node_{k}": v for k, v in self.node.timings.items()})
        return self.node

    @property
    def real_node_list(self) -> list[RealNode]:
        """Every started real node, node 0 first."""
        first = [self.node] if self.node is not None and self.node.started else []
        return first + self.further_nodes

    def add_real_node(self) -> RealNode:
        """Start one more real node (its own kubelet, containerd and image store, bridge and pod
        subnet; node.py), after node 0, which it needs. The first start of a further node
        imports the images into its store (about a minute); later clusters reuse it."""
        self.start_real_node()
        taken = {n.index for n in self.further_nodes}
        free = [i for i in range(1, MAX_REAL_NODES) if i not in taken]
        if not free:
            raise NodeUnavailable(f"{MAX_REAL_NODES} real nodes at most")
        node = RealNode(self, taint=self.taint_real_nodes, index=free[0])
        try:
            node.prepare()
            node.start()
        except BaseException:
            node.stop()  # a half-started node too
            raise
        self.further_nodes.append(node)
        self.timings.update({f"node{node.suffix}_{k}": v for k, v in node.timings.items()})
        return node

    def remove_real_node(self, node: RealNode) -> None:
        """Stop a further node and delete its Node object (as a cloud provider's node controller
        does once the machine is gone): its pods then go with it (pod garbage collection)."""
        if node not in self.further_nodes:
            raise ValueError(f"{node.name} is not a further real node of this cluster")
        node.stop()
        self.further_nodes.remove(node)
        self.kubectl("delete", "node", node.name, "--wait=false", check=False)

    def start_trainer(
        self, *, status_gate: bool = False, status_qps: float = 5.0, status_burst: int = 10
    ) -> TrainerStack:
        """Kubeflow Trainer v2 and JobSet (kubeflow_trainer.py), started on first use; Trainer is
        restarted when asked for the other TrainJobStatus gate setting or other limits of its
        status server's API client. Starts the real node first when there is one
        (Trainer's status server is reached through it)."""
        if self.node is not None:
            self.start_real_node()
        self.trainer.start(
            status_gate=status_gate, status_qps=status_qps, status_burst=status_burst
        )
        return self.trainer

    def stop_trainer(self) -> None:
        self.trainer.stop()

    def start_kueue(self) -> KueueStack:
        """Kueue (kueue.py), started on first use, with the PyTorchJob and TrainJob integrations
        and the PriorityBoost feature gate."""
        self.kueue.start()
        return self.kueue

    def stop_kueue(self) -> None:
        self.kueue.stop()

    def start_seaweedfs(self) -> SeaweedFS:
        """SeaweedFS's S3 gateway (seaweedfs.py) as a host process that pods reach at the real
        node's address (`.endpoint`; `.secret()` is a Secret for `storage.secretRef`), started on
        first use, with the real node. Its S3 ports are guarded like Trainer's status server's:
        only loopback and the node's bridge may connect."""
        if self.seaweedfs is not None:
            return self.seaweedfs
        node = self.start_real_node()
        assert self.binaries is not None and self.workdir is not None
        workdir = self.workdir / "seaweedfs"
        # A fresh store at each start: a master started again over an earlier instance's volumes
        # has lost its topology and freezes volume growth ("volume growth is frozen after master
        # state loss"), so a bucket created then gets no writable volume and every upload fails
        # (a second test module's TrainJob made no checkpoint in 240 s for that).
        shutil.rmtree(workdir / "data", ignore_errors=True)
        server = SeaweedFS(
            self.binaries.require_seaweedfs(),
            workdir,
            s3_bind="0.0.0.0",
            host=NODE_IP,
        )
        server.reserve_ports()
        for name in ("s3", "s3_grpc"):
            node.guard_host_port(server.ports[name])
        server.start()
        self.seaweedfs = server
        return server

    def stop_seaweedfs(self) -> None:
        if self.seaweedfs is not None:
            self.seaweedfs.stop()
            self.seaweedfs = None

    def stop(self) -> None:
        try:
            self.stop_seaweedfs()
            for further in reversed(self.further_nodes):
                further.stop()
            self.further_nodes.clear()
            if self.node is not None:
                self.node.stop()
                self.node = None
        finally:
            for name in reversed(list(self.procs)):
                self.procs[name].stop()
            self.procs.clear()
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def describe(self) -> dict[str, object]:
        return {
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "workdir": str(self.workdir),
            "ports": self.ports,
            "pids": {n: p.popen.pid for n, p in self.procs.items() if p.popen},
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "real_nodes": [n.name for n in self.real_node_list],
            # Its access key and secret are in <workdir>/seaweedfs/s3.json (readable by root only).
            "s3_endpoint": self.seaweedfs.endpoint if self.seaweedfs is not None else None,
        }

    # --- helpers ---
    def kubectl(
        self,
        *args: str,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float = 60,
        text: bool = True,
    ) -> subprocess.CompletedProcess:
        assert self.binaries is not None
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run(
            [str(self.binaries.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=data,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if text:
            proc = subprocess.CompletedProcess(
                proc.args,
                proc.returncode,
                proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"),
            )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr!s}"
            )
        return proc

    def token_kubeconfig(self, path: Path, service_account: str, namespace: str) -> Path:
        """Write a kubeconfig at `path` that authenticates with a fresh token of the
        ServiceAccount (to run a component with exactly its RBAC role)."""
        assert self.workdir is not None
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration=1h"
        ).stdout.strip()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "sa",
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.workdir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def apply(self, manifest: str | dict | Sequence[dict], *, server_side: bool = True) -> str:
        if not isinstance(manifest, str):
            docs = [manifest] if isinstance(manifest, dict) else list(manifest)
            manifest = yaml.safe_dump_all(docs)
        args = ["apply", "-f", "-"]
        if server_side:
            args += ["--server-side", "--field-manager=kubeckpt-tests", "--force-conflicts"]
        return self.kubectl(*args, input=manifest).stdout

    def exec_dir(self, namespace: str, pod: str, containers: Sequence[str] = ()) -> Path:
        """A directory that `kubectl exec <pod>` commands run in (a KWOK `Exec` for that pod)."""
        assert self.workdir is not None
        d = self.workdir / "exec" / namespace / pod
        d.mkdir(parents=True, exist_ok=True)
        target: dict[str, object] = {"local": {"workDir": str(d)}}
        if containers:
            target["containers"] = list(containers)
        self.apply(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Exec",
                "metadata": {"name": pod, "namespace": namespace},
                "spec": {"execs": [target]},
            }
        )
        return d

    @property
    def webhook_client_ca(self) -> Path:
        """The CA that signed the API server's client certificate for kubeckpt's webhook (the
        local webhook's --client-ca-file)."""
        assert self.workdir is not None
        return self.workdir / "pki" / f"{admission_auth.CA_NAME}.crt"

    def admin_ssl_context(self) -> ssl.SSLContext:
        assert self.workdir is not None
        pkidir = self.workdir / "pki"
        ctx = ssl.create_default_context(cafile=str(pkidir / "ca.crt"))
        ctx.load_cert_chain(str(pkidir / "admin.crt"), str(pkidir / "admin.key"))
        return ctx

    def get_json(self, path: str, timeout: float = 5) -> dict:
        with urllib.request.urlopen(
            self.server + path, context=self.admin_ssl_context(), timeout=timeout
        ) as r:
            return json.loads(r.read())

    # --- steps ---
    def _pki(self) -> None:
        assert self.workdir is not None
        d = self.workdir / "pki"
        d.mkdir()
        ca = pki.make_ca("kubeckpt-local-ca")
        ca.write(d, "ca")
        pki.issue(
            ca,
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", "10.96.0.1", NODE_IP),
            server=True,
        ).write(d, "apiserver")
        pki.issue(ca, "kubeckpt-admin", orgs=("system:masters",), client=True).write(d, "admin")
        pki.issue(ca, "kube-apiserver-kubelet-client", orgs=("system:masters",), client=True).write(
            d, "kubelet-client"
        )
        # The API server's client certificate for kubeckpt's webhook (admission_auth.py).
        admission_auth.write_pki(d)
        admission_auth.write_admission_config(
            d,
            (
                admission_auth.ADDON_SERVICE_HOST,
                f"127.0.0.1:{self.ports['kubeckpt_webhook']}",
            ),
        )
        sa_key, sa_pub = pki.service_account_keys()
        (d / "sa.key").write_bytes(sa_key)
        (d / "sa.pub").write_bytes(sa_pub)
        # KWOK serves the kubelet API (exec) over TLS with this certificate.
        pki.issue(ca, "kwok", dns_names=("localhost",), ips=("127.0.0.1",), server=True).write(
            d, "kwok"
        )
        # The training-operator's webhook: its rotator verifies the CA against the DNS name
        # "training-operator-ca" and the serving certificate against the service's DNS name.
        op_ca = pki.make_ca(
            "training-operator-ca", dns_names=("training-operator-ca",), use_rsa=True
        )
        op_ca.write(d, "operator-ca")
        pki.issue(
            op_ca,
            "training-operator",
            dns_names=(f"training-operator.{TRAINING_OPERATOR_NS}.svc",),
            ips=("127.0.0.1",),
            server=True,
            use_rsa=True,
        ).write(d, "operator-webhook")
        self.write_kubeconfig(self.kubeconfig, "kubeckpt-admin", d / "admin.crt", d / "admin.key")

    def write_kubeconfig(self, path: Path, user: str, crt: Path, key: Path) -> None:
        """A kubeconfig for this cluster's API server as `user` (a client certificate)."""
        assert self.workdir is not None
        write_kubeconfig(path, self.server, self.workdir / "pki" / "ca.crt", user, crt, key)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        assert self.workdir is not None
        p = Process(name, argv, self.workdir / "logs" / f"{name}.log", env=env)
        p.start()
        self.procs[name] = p
        return p

    def _start_etcd(self) -> None:
        assert self.workdir is not None and self.binaries is not None
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd_peer']}"
        p = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=kubeckpt",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=kubeckpt={peer}",
                # A throwaway test store: skip fsync so the tests run at memory speed.
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(client + "/health", timeout=1) as r:
                return json.loads(r.read()).get("health") == "true"

        wait_ready("etcd health", p, healthy, 30)

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    def apiserver_argv(self) -> list[str]:
        assert self.workdir is not None and self.binaries is not None
        d = self.workdir / "pki"
        if self.node is not None:
            # Pods reach the API server through the `kubernetes` Service at the node's address
            # (node.py lets only loopback and the node's bridge connect); kubelets are
            # authorized as nodes; webhook Services are called at their endpoints.
            network = [
                "--bind-address=0.0.0.0",
                f"--advertise-address={NODE_IP}",
                "--authorization-mode=Node,RBAC",
                "--enable-aggregator-routing=true",
            ]
        else:
            network = [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--authorization-mode=RBAC",
                # No kube-proxy: the "kubernetes" Service endpoints would only log errors.
                "--endpoint-reconciler-type=none",
            ]
        # With a real node the tokens' issuer is an address the API server is reached at (by
        # the host and by pods), so that OIDC discovery of it works: Trainer's status server
        # verifies pods' projected tokens that way. The in-cluster name stays accepted.
        issuers = [f"--service-account-issuer={ISSUER}"]
        if self.node is not None:
            issuers.insert(
                0, f"--service-account-issuer=https://{NODE_IP}:{self.ports['apiserver']}"
            )
        elif self.loopback_issuer:
            issuers.insert(0, f"--service-account-issuer={self.server}")
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            *network,
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            f"--admission-control-config-file={d / 'admission.yaml'}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            *issuers,
            f"--api-audiences={ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={d / 'kubelet-client.crt'}",
            f"--kubelet-client-key={d / 'kubelet-client.key'}",
            f"--kubelet-certificate-authority={d / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=1",
        ]

    def _start_apiserver(self) -> None:
        p = self._spawn("kube-apiserver", self.apiserver_argv())
        wait_ready("kube-apiserver /readyz", p, lambda: self._get_ok("/readyz"), 60)

    def restart_apiserver(self, pause: float = 0.0) -> None:
        """Stop the API server and start it again (tests of watch resumption use this)."""
        self.procs["kube-apiserver"].stop()
        time.sleep(pause)
        p = Process("kube-apiserver", self.apiserver_argv(), self.procs["kube-apiserver"].log)
        p.start()
        self.procs["kube-apiserver"] = p
        wait_ready("kube-apiserver /readyz", p, lambda: self._get_ok("/readyz"), 60)

    def _get_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(
                self.server + path, context=self.admin_ssl_context(), timeout=2
            ) as r:
                return r.status == 200
        except urllib.error.URLError:
            return False

    def _start_controllers(self) -> None:
        assert self.workdir is not None and self.binaries is not None
        d = self.workdir / "pki"
        kc = str(self.kubeconfig)
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                # nodelifecycle lifts the not-ready taint that admission puts on every new node,
                # and taints nodes that stop heartbeating (a preemption test can use that).
                # clusterrole-aggregation: view/edit/admin gain kubeckpt's user roles, as on
                # any real cluster.
                "--controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token,"
                "root-ca-cert-publisher,nodelifecycle,persistentvolume-binder,"
                "clusterrole-aggregation"
                # Pods that run for real: our Deployments, Services' endpoints, Jobs, evictions.
                + (REAL_NODE_CONTROLLERS if self.node is not None else ""),
                "--node-monitor-period=1s",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        if self.nodes:
            self._start_kwok(kc, d)

    def _start_kwok(self, kc: str, d: Path) -> None:
        """KWOK, for the fake nodes; a cluster without any (the demo's) does not start it."""
        assert self.binaries is not None and self.workdir is not None
        kwok, _, kwok_stage_dir = self.binaries.require_kwok()
        kwok_config = self.workdir / "kwok.yaml"
        stages = sorted(kwok_stage_dir.glob("*.yaml"))
        kwok_config.write_text(kwok_stages([s.read_text() for s in stages]))
        self._spawn(
            "kwok",
            [
                str(kwok),
                f"--kubeconfig={kc}",
                f"--config={kwok_config}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-ip=127.0.0.1",
                f"--node-port={self.ports['kwok']}",
                # Node Leases as heartbeats: without them the node-lifecycle controller marks the
                # nodes Unknown every ~50 s and KWOK's initialize stage rewrites their addresses,
                # which breaks exec while it lasts.
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
                f"--tls-cert-file={d / 'kwok.crt'}",
                f"--tls-private-key-file={d / 'kwok.key'}",
                f"--cidr={POD_CIDR}",
                "--enable-crds=Exec,ClusterExec,Logs,ClusterLogs",
            ],
            env={**os.environ, "HOME": str(self.workdir)},
        )

    def _install_crds(self) -> None:
        assert self.binaries is not None
        files: list[Path] = []
        dirs = [OUR_CRDS, self.binaries.training_operator_crds]
        if self.nodes:
            dirs.append(self.binaries.require_kwok()[1])
        for d in dirs:
            files += sorted(d.glob("*.yaml"))
        if not any(f.parent == OUR_CRDS for f in files):
            raise ClusterError(f"no CRDs found in {OUR_CRDS}")
        args: list[str] = ["apply", "--server-side", "--field-manager=kubeckpt-localcluster"]
        for f in files:
            args += ["-f", str(f)]
        self.kubectl(*args)
        # Polled here, not with `kubectl wait --for=condition=Established crd --all`: that fails
        # at once ("<nil> is of the type <nil>") on a CRD whose status has no conditions yet.
        wait_for(self._crds_established, "the CRDs to be Established", timeout=60)

    def _crds_established(self) -> bool:
        crds = json.loads(self.kubectl("get", "crd", "-o", "json").stdout).get("items") or []
        return bool(crds) and all(
            any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            )
            for crd in crds
        )

    def _start_training_operator(self) -> None:
        assert self.workdir is not None and self.binaries is not None
        d = self.workdir / "pki"
        ns = TRAINING_OPERATOR_NS
        # The rotator finds a valid CA and certificate in its Secret and keeps them; the webhook
        # server reads the same files from $TMPDIR/k8s-webhook-server/serving-certs.
        tmp = self.workdir / "operator-tmp"
        certdir = tmp / "k8s-webhook-server" / "serving-certs"
        certdir.mkdir(parents=True)
        shutil.copy(d / "operator-webhook.crt", certdir / "tls.crt")
        shutil.copy(d / "operator-webhook.key", certdir / "tls.key")
        TRAINING_OPERATOR_ROTATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            target = TRAINING_OPERATOR_ROTATOR_CERT_DIR / name
            if not target.exists():  # the rotator only checks that the file exists
                shutil.copy(certdir / name, target)
        import base64

        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        url = f"https://127.0.0.1:{self.ports['operator_webhook']}"
        webhooks = []
        for kind in ("pytorchjob", "tfjob", "xgboostjob", "paddlejob", "mxjob"):
            webhooks.append(
                {
                    "name": f"validator.{kind}.training-operator.kubeflow.org",
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {
                        "url": f"{url}/validate-kubeflow-org-v1-{kind}",
                        "caBundle": b64(d / "operator-ca.crt"),
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "timeoutSeconds": 5,
                    "rules": [
                        {
                            "apiGroups": ["kubeflow.org"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": [f"{kind}s"],
                        }
                    ],
                }
            )
        self.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "training-operator-webhook-cert", "namespace": ns},
                    "data": {
                        "ca.crt": b64(d / "operator-ca.crt"),
                        "ca.key": b64(d / "operator-ca.key"),
                        "tls.crt": b64(d / "operator-webhook.crt"),
                        "tls.key": b64(d / "operator-webhook.key"),
                    },
                },
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": "validator.training-operator.kubeflow.org"},
                    "webhooks": webhooks,
                },
            ]
        )
        self.ports["operator_probe"] = free_port()
        self.ports["operator_metrics"] = free_port()
        self._spawn(
            "training-operator",
            [
                str(self.binaries.training_operator),
                f"--kubeconfig={self.kubeconfig}",
                f"--webhook-server-port={self.ports['operator_webhook']}",
                f"--health-probe-bind-address=127.0.0.1:{self.ports['operator_probe']}",
                f"--metrics-bind-address=127.0.0.1:{self.ports['operator_metrics']}",
                "--leader-elect=false",
                # Its worker init container (nslookup of the master) from the node's own images.
                f"--pytorch-init-container-image={IMAGES['init']}",
            ],
            env={**os.environ, "TMPDIR": str(tmp), "MY_POD_NAMESPACE": ns},
        )

    def _create_nodes(self) -> None:
        nodes = []
        for i in range(self.nodes):
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": f"kwok-node-{i}",
                        "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                        "labels": {
                            "type": "kwok",
                            "kubernetes.io/hostname": f"kwok-node-{i}",
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                        },
                    },
                    "spec": {"taints": [KWOK_TAINT]} if self.taint_kwok_nodes else {},
                }
            )
        if nodes:
            self.apply(nodes)

    def _wait_ready(self) -> None:
        def nodes_ready() -> bool:
            items = self.get_json("/api/v1/nodes")["items"]
            ready = [
                n
                for n in items
                if any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
                and not [t for t in n["spec"].get("taints") or [] if t not in ALLOWED_TAINTS]
            ]
            return len(ready) >= self.nodes

        if self.nodes:
            wait_ready("KWOK nodes Ready and untainted", self.procs["kwok"], nodes_ready, 30)

        def default_sa() -> bool:
            self.get_json("/api/v1/namespaces/default/serviceaccounts/default")
            return True

        wait_ready(
            "the default ServiceAccount", self.procs["kube-controller-manager"], default_sa, 30
        )
        probe = f"http://127.0.0.1:{self.ports['operator_probe']}/readyz"

        def operator_ready() -> bool:
            with urllib.request.urlopen(probe, timeout=1) as r:
                return r.status == 200

        wait_ready(
            "training-operator readiness", self.procs["training-operator"], operator_ready, 60
        )
        for name in ("kube-scheduler",):
            if not self.procs[name].alive():
                raise ClusterError(f"{name} exited:\n{self.procs[name].tail()}")


@contextlib.contextmanager
def local_cluster(**kwargs: object) -> Iterator[LocalCluster]:
    c = LocalCluster(**kwargs)  # type: ignore[arg-type]
    c.start()
    try:
        yield c
    finally:
        c.stop()
