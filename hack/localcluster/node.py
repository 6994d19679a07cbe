"""A real node beside the KWOK ones: containerd, runc, the CNI bridge, a kubelet, kube-proxy and
CoreDNS, run as host processes (what kind runs inside its node container, assembled the way
`local-up-cluster.sh` does it).

Addresses never leave the machine: the node's address is on a local bridge (`kubeckpt0`, no
uplink), the pods live in network namespaces on that bridge, and a FORWARD rule drops whatever a
pod sends towards any other interface. CoreDNS answers cluster names only (no upstream). Images
come only from what `hack/images/build.sh` built and imported; pods use `imagePullPolicy: Never`.

Host-wide state is torn down on stop and, after a crash, on the next start (the host-wide
`realnode.json` record under the cache says what to remove): processes, the containers' cgroups,
mounts under the work dir, the pods' network namespaces, the bridge, iptables chains. containerd
keeps only its image store across clusters (under ~/.cache/kubeckpt/containerd): unpacking the
training image again at every start would cost a minute; the containers of a run are removed.
Only one cluster with a real node can run on a machine at a time (a lock says which).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import pki
from .image_store import (
    LOCK,
    containerd_config,
    containerd_socket,
    ctr_call,
    import_missing,
    store_root,
)
from .images import IMAGES, ensure_images
from .processes import Process, free_port, wait_ready

if TYPE_CHECKING:
    from .handle import ClusterHandle


def node_name(index: int) -> str:
    return f"kubeckpt-node-{index}"


def bridge_name(index: int) -> str:
    return f"kubeckpt{index}"


def node_ip(index: int) -> str:
    return f"10.87.{index}.1"


def pod_subnet(index: int) -> str:
    return f"10.87.{index}.0/24"


# Node 0 is the cluster's first real node: it runs CoreDNS and kube-proxy, and the API server
# advertises its address. Further nodes (index 1, ...) share the host's network namespace, so
# node 0's kube-proxy and CoreDNS serve their pods too.
BRIDGE = bridge_name(0)
NODE_IP = node_ip(0)
POD_SUBNET = pod_subnet(0)
NODE_NAME = node_name(0)
CLUSTER_CIDR = "10.87.0.0/16"  # every node's pod subnet
BRIDGES = "kubeckpt+"  # iptables' wildcard for every node's bridge
MAX_REAL_NODES = 8
REAL_NODE_LABEL = "kubeckpt.io/real-node"
# Tests' pods tolerate this; the KWOK-based tests never land on the real node.
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
CNI_BIN = Path("/usr/lib/cni")
NETNS_DIR = Path("/var/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
ISOLATE_CHAIN = "KUBECKPT-ISOLATE"
IP_FORWARD = "/proc/sys/net/ipv4/ip_forward"
PAUSE_IMAGE = IMAGES["pause"]
NEEDED_COMMANDS = ("containerd", "ctr", "runc", "iptables", "iptables-save", "ip")


def cache_dir() -> Path:
    return Path(os.environ.get("KUBECKPT_CACHE", Path.home() / ".cache" / "kubeckpt"))


class NodeUnavailable(RuntimeError):
    """A real node cannot run on this machine; the message says what to do."""


def host_problem() -> str | None:
    """Why this machine cannot run a real node, or None."""
    if os.geteuid() != 0:
        return "a real node needs root (network namespaces, mounts, cgroups, iptables)"
    missing = [c for c in NEEDED_COMMANDS if shutil.which(c) is None]
    if not (CNI_BIN / "bridge").exists():
        missing.append(str(CNI_BIN / "bridge"))
    if missing:
        return (
            f"missing {', '.join(missing)}: run `make binaries` as root (it installs Debian's "
            "containerd runc containernetworking-plugins iptables conntrack)"
        )
    if (
        not CGROUP_ROOT.joinpath("memory").is_dir()
        and not CGROUP_ROOT.joinpath("cgroup.controllers").exists()
    ):
        return f"no cgroup hierarchy at {CGROUP_ROOT}"
    foreign = _foreign_node_processes()
    if foreign:
        return (
            f"this machine already runs {foreign}: a second kubelet and kube-proxy would share "
            "its kubepods cgroups and KUBE-* iptables chains (and our teardown would remove "
            "them); the real node needs a machine without another Kubernetes node on it"
        )
    return None


def _foreign_node_processes() -> str:
    """A kubelet or kube-proxy on this machine that is not one of ours (ours die with their
    cluster, PR_SET_PDEATHSIG, so any one found before our node starts is someone else's)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = proc.joinpath("comm").read_text().strip()
        except OSError:
            continue
        if comm in ("kubelet", "kube-proxy"):
            return f"{comm} (pid {proc.name})"
    return ""


def run(*argv: str, check: bool = True, timeout: float = 60, input: str | None = None) -> str:
    p = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, input=input
    )
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


# --- host-wide teardown (also the crash sweep) -------------------------------------------------
def _cgroup_dirs(top: str) -> list[Path]:
    """Every cgroup directory under `top` in every hierarchy, deepest first (cgroups vanish while
    we walk: the kubelet or runc may be removing them)."""
    found: list[Path] = []
    with contextlib.suppress(OSError):
        for sub in CGROUP_ROOT.iterdir():
            for dirpath, _, _ in os.walk(sub / top, topdown=False, onerror=lambda e: None):
                found.append(Path(dirpath))
    return found


def cgroup_pids(top: str) -> set[int]:
    """The processes in the cgroups under `top`, in every hierarchy."""
    pids: set[int] = set()
    for d in _cgroup_dirs(top):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(pid) for pid in (d / "cgroup.procs").read_text().split())
    return pids


def _kill_cgroup_tree(top: str = "kubepods") -> int:
    """SIGKILL every process in the kubelet's cgroups and remove the cgroups; returns how many
    processes were signalled."""
    killed = 0
    for pid in cgroup_pids(top):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    for _ in range(50):
        dirs = _cgroup_dirs(top)
        for d in dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
        if not _cgroup_dirs(top):
            break
        time.sleep(0.1)
    return killed


def _kill_matching(pattern: str) -> None:
    """SIGKILL processes whose command line contains `pattern` (containerd shims of a run)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if pattern in proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)


def _unmount_under(path: Path) -> None:
    """Unmount everything mounted below `path` (tmpfs volumes, overlay rootfs), deepest first."""
    prefix = str(path.resolve()) + "/"
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            target = line.split()[4].replace("\\040", " ")
            if target.startswith(prefix):
                mounts.append(target)
    for target in sorted(set(mounts), key=lambda m: -m.count("/")):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def _remove_netns() -> None:
    """The pods' network namespaces (CRI names them cni-<uuid>); unmounting one drops its veth."""
    if not NETNS_DIR.is_dir():
        return
    for ns in NETNS_DIR.glob("cni-*"):
        subprocess.run(["umount", "-l", str(ns)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            ns.unlink()


def _iptables_cleanup() -> None:
    """Remove the chains of kube-proxy (KUBE-*), the kubelet (KUBE-*) and ours (KUBECKPT-*)."""
    for tool in ("iptables", "ip6tables"):
        save = shutil.which(f"{tool}-save")
        if save is None:
            continue
        dump = run(save, check=False)
        table = ""
        chains: dict[str, list[str]] = {}
        jumps: list[tuple[str, list[str]]] = []
        for line in dump.splitlines():
            if line.startswith("*"):
                table = line[1:]
                chains.setdefault(table, [])
            elif line.startswith(":"):
                name = line[1:].split()[0]
                if name.startswith(("KUBE-", "KUBECKPT-")):
                    chains[table].append(name)
            elif line.startswith("-A "):
                parts = line.split()
                chain = parts[1]
                target = parts[parts.index("-j") + 1] if "-j" in parts else ""
                if not chain.startswith(("KUBE-", "KUBECKPT-")) and target.startswith(
                    ("KUBE-", "KUBECKPT-")
                ):
                    jumps.append((table, parts[1:]))
        for table, rule in jumps:
            # iptables-save quotes comments; the argv form needs them unquoted.
            spec = [a.strip('"') for a in _split_rule(" ".join(rule))]
            subprocess.run([tool, "-t", table, "-D", *spec], capture_output=True, check=False)
        for table, names in chains.items():
            for name in names:
                subprocess.run([tool, "-t", table, "-F", name], capture_output=True, check=False)
            for name in names:
                subprocess.run([tool, "-t", table, "-X", name], capture_output=True, check=False)


def _split_rule(rule: str) -> list[str]:
    return re.findall(r'"[^"]*"|\S+', rule)


def _delete_bridge(name: str = BRIDGE) -> None:
    subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


def _node_bridges() -> list[str]:
    """Every node's bridge on the host (kubeckpt0, kubeckpt1, ...)."""
    out = run("ip", "-o", "link", "show", "type", "bridge", check=False)
    return re.findall(r"^\d+: (kubeckpt\d+)[:@]", out, re.MULTILINE)


def _delete_node_bridges() -> None:
    for name in _node_bridges():
        _delete_bridge(name)


def pod_cgroups(index: int) -> str:
    """The top-level cgroup that holds node `index`'s pods: the kubelet's default `kubepods` for
    node 0; for the others a cgroupRoot named for the node, so that two kubelets on one host
    never manage (or kill) each other's pods."""
    return "kubepods" if index == 0 else node_name(index)


def _extra_cgroup_tops() -> list[str]:
    """The pod_cgroups of nodes other than node 0 on the host (after a crash too)."""
    tops: set[str] = set()
    with contextlib.suppress(OSError):
        for sub in CGROUP_ROOT.iterdir():
            with contextlib.suppress(OSError):
                tops.update(d.name for d in sub.glob("kubeckpt-node-*") if d.is_dir())
    return sorted(tops)


def _kill_all_node_cgroups() -> None:
    _kill_cgroup_tree()
    for top in _extra_cgroup_tops():
        _kill_cgroup_tree(top)


@dataclass
class HostRecord:
    """What a running real node changed on the host, so that a crash can be undone later."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)

    def load(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}


def teardown_host(record: dict[str, Any]) -> list[str]:
    """Undo a real node's host changes. Idempotent; every step runs even if one fails (the
    containers' processes go first); returns what failed."""
    workdir = Path(record["workdir"]) if record.get("workdir") else None
    steps: list[tuple[str, Any]] = [("containers", _kill_all_node_cgroups)]
    if workdir is not None:  # every node's containerd state is under workdir/containerd*
        steps.append(("shims", lambda: _kill_matching(str(workdir / "containerd"))))
    steps.append(("network namespaces", _remove_netns))
    if workdir is not None:
        steps.append(("mounts", lambda: _unmount_under(workdir)))
    steps += [("iptables", _iptables_cleanup), ("bridges", _delete_node_bridges)]
    forward = record.get("ip_forward")
    if forward is not None:
        steps.append(("ip_forward", lambda: Path(IP_FORWARD).write_text(str(forward))))
    failed = []
    for what, step in steps:
        try:
            step()
        except Exception as e:  # one step's failure must not leave the rest undone
            failed.append(f"{what}: {e}")
    return failed


def sweep_stale_real_node() -> None:
    """Undo what a crashed run's real node left on the host (nothing when none did, or when a
    live cluster holds the lock)."""
    if os.geteuid() != 0:
        return
    cache = cache_dir()
    record = HostRecord(cache / "realnode.json")
    if not record.path.exists():
        return
    fd = os.open(cache / "realnode.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return
    try:
        stale = record.load()
        teardown_host(stale)
        if stale.get("workdir"):
            shutil.rmtree(stale["workdir"], ignore_errors=True)
        with contextlib.suppress(OSError):
            record.path.unlink()
    finally:
        os.close(fd)


# --- the node ------------------------------------------------------------------------------------
@dataclass
class RealNode:
    """One real node of `cluster`. Node 0: `prepare()` before the API server starts (the node's
    address must exist for the API server to advertise it), `start()` after the control plane.
    A further node (`index` 1, ...) is prepared and started after node 0: its own kubelet,
    containerd (and image store), bridge, pod subnet and cgroup parent, on the same host."""

    cluster: ClusterHandle
    taint: bool = False
    index: int = 0
    procs: dict[str, Process] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.cluster.workdir is not None
        if not 0 <= self.index < MAX_REAL_NODES:
            raise ValueError(f"real node index {self.index} out of 0..{MAX_REAL_NODES - 1}")
        self.name = node_name(self.index)
        self.ip = node_ip(self.index)
        self.bridge = bridge_name(self.index)
        self.subnet = pod_subnet(self.index)
        self.pod_cgroups = pod_cgroups(self.index)
        # Node 0 keeps the names it always had (logs, ports, files); the others get a suffix.
        self.suffix = "" if self.index == 0 else f"-{self.index}"
        self.dir = self.cluster.workdir / f"node{self.suffix}"
        self.cache = cache_dir()
        self.ctrd_root = store_root(self.cache, self.index)
        self.ctrd_dir = self.cluster.workdir / f"containerd{self.suffix}"
        self.sock = containerd_socket(self.ctrd_dir)
        self.ctr = ctr_call(self.sock)
        self._lock_fd: int | None = None
        self.record = HostRecord(self.cache / "realnode.json")
        self.started = False
        self.guarded_ports: set[int] = set()

    # --- lifecycle ---
    def prepare(self) -> None:
        if self.index:
            self._prepare_further_node()
            return
        if os.geteuid() != 0:
            raise NodeUnavailable(host_problem() or "not root")
        self.cache.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.cache / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = self.record.load().get("pid", "?")
            os.close(self._lock_fd)
            self._lock_fd = None
            raise NodeUnavailable(
                f"another cluster with a real node runs on this machine (pid {owner}); "
                "stop it first (make cluster-down), one real node per machine"
            ) from None
        # Checked under the lock: a kubelet found now is not one of our clusters'.
        problem = host_problem()
        if problem:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise NodeUnavailable(problem)
        stale = self.record.load()
        if stale:  # left by a crashed run; its owner is gone (we hold the lock)
            teardown_host(stale)
            if stale.get("workdir"):
                shutil.rmtree(stale["workdir"], ignore_errors=True)
        forward = Path(IP_FORWARD).read_text().strip()
        self.record.data = {
            "pid": os.getpid(),
            "workdir": str(self.cluster.workdir),
            "ip_forward": forward,
        }
        self.record.save()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._network_up()

    def _prepare_further_node(self) -> None:
        """Node 0 holds the machine's lock and set up the host (iptables, forwarding, the crash
        record; its teardown removes every node's bridge and cgroups): a further node only needs
        its bridge and its cgroup parent."""
        if not self._node_0_started():
            raise NodeUnavailable(f"{self.name} needs the cluster's real node 0 started first")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._bridge_up()
        self._cgroup_parent_up()

    def _node_0_started(self) -> bool:
        node = self.cluster.node
        return isinstance(node, RealNode) and node.started and node.index == 0

    def start(self) -> None:
        self.started = True  # stop() undoes a half-started node as well
        t0 = time.monotonic()
        self._pki()
        self._start_containerd()
        self._import_images()
        self.timings["images"] = time.monotonic() - t0
        if self.index == 0:  # one of each per host network namespace (see the constants)
            self._start_coredns()
            self._start_kube_proxy()
        self._start_kubelet()
        self._wait_ready()
        self.timings["node_ready"] = time.monotonic() - t0

    def stop(self) -> None:
        kubelet = self.procs.pop("kubelet", None)
        if kubelet is not None:
            kubelet.stop(timeout=5)
        _kill_cgroup_tree(self.pod_cgroups)
        if "containerd" in self.procs and self.procs["containerd"].alive():
            self._remove_containers()
        for name in reversed(list(self.procs)):
            self.procs[name].stop(timeout=5)
        self.procs.clear()
        if self.index:
            self._undo_further_node()
            return
        teardown_host(self.record.data)
        with contextlib.suppress(OSError):
            self.record.path.unlink()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _undo_further_node(self) -> None:
        """Node 0's teardown_host, for this node's part of the host only."""
        _kill_matching(f"{self.ctrd_dir}/")  # shims left by a killed containerd
        _kill_cgroup_tree(self.pod_cgroups)
        _unmount_under(self.dir)
        _unmount_under(self.ctrd_dir)
        _delete_bridge(self.bridge)
        # A node added again later starts clean (the kubelet's and containerd's state).
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.ctrd_dir, ignore_errors=True)

    def power_off(self) -> None:
        """The node dies at once, as a machine losing power: its kubelet, containerd, the
        containerd shims and every process of its pods SIGKILLed; nothing runs a preStop hook,
        nothing tells the API server. Its Node object and pods stay as they were until the
        cluster notices (or someone deletes the Node, as a cloud provider's node controller
        does for a vanished machine). `stop()` still cleans up after it."""
        for name in ("kubelet", "containerd"):
            if name in self.procs:
                self.procs[name].kill()
        _kill_matching(f"{self.ctrd_dir}/")
        _kill_cgroup_tree(self.pod_cgroups)

    # --- network ---
    def _bridge_up(self) -> None:
        _delete_bridge(self.bridge)
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.ip}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")

    def _cgroup_parent_up(self) -> None:
        """The kubelet refuses a cgroupRoot that does not exist in every hierarchy; cpuset's
        needs its CPUs and memory nodes before any process may join a child of it."""
        for hierarchy in CGROUP_ROOT.iterdir():
            if not (hierarchy / "cgroup.procs").exists():
                continue
            d = hierarchy / self.pod_cgroups
            d.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (d / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((hierarchy / knob).read_text())

    def _network_up(self) -> None:
        """Node 0's bridge and the host's rules, written for every node's bridge at once."""
        self._bridge_up()
        # Pods reach each other (on any node) and the host; nothing they send is forwarded
        # anywhere else.
        run("iptables", "-N", ISOLATE_CHAIN)
        run("iptables", "-A", ISOLATE_CHAIN, "-i", BRIDGES, "-o", BRIDGES, "-j", "ACCEPT")
        run("iptables", "-A", ISOLATE_CHAIN, "-i", BRIDGES, "-j", "DROP")
        run("iptables", "-A", ISOLATE_CHAIN, "-o", BRIDGES, "-j", "ACCEPT")
        run("iptables", "-I", "FORWARD", "1", "-j", ISOLATE_CHAIN)
        # The API server listens on every local address (pods reach it at the node's address):
        # only loopback and the bridges may connect.
        port = str(self.cluster.ports["apiserver"])
        run("iptables", "-N", "KUBECKPT-APISERVER")
        run("iptables", "-A", "KUBECKPT-APISERVER", "-i", "lo", "-j", "RETURN")
        run("iptables", "-A", "KUBECKPT-APISERVER", "-i", BRIDGES, "-j", "RETURN")
        run("iptables", "-A", "KUBECKPT-APISERVER", "-j", "DROP")
        run(
            "iptables", "-I", "INPUT", "1", "-p", "tcp", "--dport", port, "-j", "KUBECKPT-APISERVER"
        )
        # Bridged traffic must pass iptables, or replies from a Service's pod skip the un-DNAT.
        with contextlib.suppress(OSError):
            Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1")

    def guard_host_port(self, port: int) -> None:
        """A host process that pods reach at the node's address but that listens on every
        address (Trainer's status server): only loopback and the bridges may connect."""
        self.guarded_ports.add(port)
        run(
            "iptables", "-I", "INPUT", "1", "-p", "tcp", "--dport", str(port),
            "-j", "KUBECKPT-APISERVER",
        )  # fmt: skip

    def _cni_config(self) -> dict[str, Any]:
        first = f"10.87.{self.index}.10"
        return {
            "cniVersion": "0.4.0",
            "name": "kubeckpt",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet, "rangeStart": first}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    # --- certificates ---
    def _pki(self) -> None:
        assert self.cluster.workdir is not None
        d = self.cluster.workdir / "pki"
        ca = pki.KeyPair.read(d, "ca")
        client, serving = f"kubelet{self.suffix}", f"kubelet-serving{self.suffix}"
        pki.issue(ca, f"system:node:{self.name}", orgs=("system:nodes",), client=True).write(
            d, client
        )
        pki.issue(ca, self.name, dns_names=(self.name,), ips=(self.ip,), server=True).write(
            d, serving
        )
        self.serving = (d / f"{serving}.crt", d / f"{serving}.key")
        self.kubeconfig = self.dir / "kubelet.kubeconfig"
        self.cluster.write_kubeconfig(
            self.kubeconfig, f"system:node:{self.name}", d / f"{client}.crt", d / f"{client}.key"
        )

    # --- containerd ---
    def _containerd_config(self) -> str:
        cni_conf = self.dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-kubeckpt.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        # Every registry resolves to a closed loopback port: a missing image fails at once and
        # nothing is pulled from outside (the pods also use imagePullPolicy: Never).
        closed = "http://127.0.0.1:9"
        cri = f"""
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.ctrd_dir / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # runc cannot lower oom_score_adj in these VMs ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."*"]
    endpoint = ["{closed}"]
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
    endpoint = ["{closed}"]
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."kubeckpt.local"]
    endpoint = ["{closed}"]
"""
        return containerd_config(self.ctrd_root, self.ctrd_dir, cri=True) + cri

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        assert self.cluster.workdir is not None
        log = self.cluster.workdir / "logs" / f"{name}{self.suffix}.log"
        p = Process(name, argv, log, env=env)
        p.start()
        self.procs[name] = p
        return p

    def _start_containerd(self) -> None:
        self.ctrd_root.mkdir(parents=True, exist_ok=True)
        self.ctrd_dir.mkdir(parents=True, exist_ok=True)
        config = self.ctrd_dir / "config.toml"
        config.write_text(self._containerd_config())
        p = self._spawn("containerd", ["containerd", "--config", str(config)])
        wait_ready("containerd", p, lambda: bool(self.ctr("version", timeout=5)), 30)
        # Containers of an earlier run (crashed, or of another cluster) are removed; the image
        # store stays.
        self._remove_containers()

    def _remove_containers(self) -> None:
        ids = self.ctr("containers", "ls", "-q").split()
        for cid in ids:
            self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", cid, timeout=30, check=False)
        for cid in ids:
            self.ctr("tasks", "delete", "-f", cid, timeout=30, check=False)
            self.ctr("containers", "rm", cid, timeout=30, check=False)

    def _import_images(self) -> None:
        """Import the archives `hack/images/build.sh` made that the store lacks (usually none:
        `make demo` and `make test` preload the store while Kubernetes builds, image_store.py)."""
        archives = ensure_images(build=os.environ.get("KUBECKPT_NO_BUILD") != "1")
        try:
            import_missing(self.ctr, self.ctrd_root, archives)
        except RuntimeError as e:
            raise NodeUnavailable(str(e)) from None

    # --- CoreDNS ---
    def _start_coredns(self) -> None:
        assert self.cluster.binaries is not None
        ready = self.cluster.ports["coredns_ready"] = free_port()
        corefile = self.dir / "Corefile"
        # No `forward`: names outside the cluster get NXDOMAIN/SERVFAIL, nothing goes upstream.
        corefile.write_text(
            f""".:53 {{
    bind {NODE_IP}
    errors
    ready 127.0.0.1:{ready}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig} kubeckpt-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
    loop
}}
"""
        )
        p = self._spawn("coredns", [str(self.cluster.binaries.coredns), "-conf", str(corefile)])

        def ok() -> bool:
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{ready}/ready", timeout=1) as r:
                return r.status == 200

        wait_ready("CoreDNS ready", p, ok, 30)

    # --- kube-proxy ---
    def _start_kube_proxy(self) -> None:
        assert self.cluster.binaries is not None
        metrics = free_port()
        health = self.cluster.ports["kube_proxy_health"] = free_port()
        config = self.dir / "kube-proxy.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig)},
                    "mode": "iptables",
                    "hostnameOverride": self.name,
                    "clusterCIDR": CLUSTER_CIDR,
                    "bindAddress": NODE_IP,
                    "metricsBindAddress": f"127.0.0.1:{metrics}",
                    "healthzBindAddress": f"127.0.0.1:{health}",
                    # Leave the host's conntrack table size alone.
                    "conntrack": {"maxPerCore": 0},
                    "iptables": {"syncPeriod": "10s", "minSyncPeriod": "0s"},
                }
            )
        )
        self._spawn(
            "kube-proxy", [str(self.cluster.binaries.kube_proxy), f"--config={config}", "--v=1"]
        )

    # --- kubelet ---
    def _start_kubelet(self) -> None:
        assert self.cluster.binaries is not None and self.cluster.workdir is not None
        d = self.cluster.workdir / "pki"
        port = self.cluster.ports[f"kubelet{self.suffix}"] = free_port()
        healthz = self.cluster.ports[f"kubelet_healthz{self.suffix}"] = free_port()
        root = self.dir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        resolv = self.dir / "resolv.conf"
        resolv.write_text(f"nameserver {NODE_IP}\n")  # dnsPolicy Default: no outside resolver
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(d / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(self.serving[0]),
            "tlsPrivateKeyFile": str(self.serving[1]),
            # The host has cgroup v1 and no systemd managing it.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "clusterDNS": [NODE_IP],  # node 0's CoreDNS serves every node
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            "failSwapOn": False,
            "podLogsDir": str(self.dir / "pod-logs"),
            "volumePluginDir": str(self.dir / "volume-plugins"),
            # A test machine's disk is shared: evict only when it is really full, never GC our
            # images (they cannot be pulled back).
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "maxPods": 110,
        }
        if self.index:
            config["cgroupRoot"] = "/" + self.pod_cgroups
        path = self.dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = [
            str(self.cluster.binaries.kubelet),
            f"--config={path}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={root}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            f"--node-labels={REAL_NODE_LABEL}=true",
            "--v=1",
        ]
        if self.taint:
            t = REAL_NODE_TAINT
            argv.append(f"--register-with-taints={t['key']}={t['value']}:{t['effect']}")
        self._spawn("kubelet", argv)

    def _wait_ready(self) -> None:
        def ready() -> bool:
            node = self.cluster.get_json(f"/api/v1/nodes/{self.name}")
            return any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            )

        wait_ready(f"real node {self.name} Ready", self.procs["kubelet"], ready, 90)
