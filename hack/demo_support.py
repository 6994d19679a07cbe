"""The parts of `make demo` around the cluster: the add-on's two processes, and a stand-in kubelet.

KWOK nodes run no containers, so the demo plays the kubelet for the job's master pod: it starts the
pod's training process on this host with the env the webhook put in the admitted pod, runs the
pod's preStop hook and sends SIGTERM when the pod is deleted, and reports the container's exit
(with its termination message) in the pod's status, as a kubelet would.

A pod's filesystem is its KWOK Exec working directory (`pod root`): a path under one of the
injected emptyDir mounts (`/var/run/kubeckpt/...`) lives at `<pod root>/var/run/kubeckpt/...`.
The training process gets its env rewritten that way. Commands exec'd into the pod (the
reconciler's `cat /var/run/kubeckpt/progress.json`) are run by KWOK in the pod root, so a `cat`
shim first on KWOK's PATH applies the same mapping; outside a pod root it is plain `cat`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from localcluster import LocalCluster, die_with_parent, free_port, stop_process, wait_for
from trainer_runtime.contract import RUN_DIR

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
ADDON_NS = "kubeckpt-system"
MWC_NAME = "kubeckpt-webhook"
POD_ROOT_MARKER = ".kubeckpt-demo-pod-root"
FINALIZER = "demo.kubeckpt.io/kubelet"  # keeps a deleted pod until "its containers" have exited
TERMINATION_LOG = "/dev/termination-log"
MAX_TERMINATION_MESSAGE = 4096
# Pod paths that live under the pod root: the injected emptyDir, and the termination log.
POD_PATHS = (RUN_DIR, TERMINATION_LOG)


def spawn(argv: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    try:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            **kw,
        )
    finally:
        out.close()


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def write_cat_shim(bin_dir: Path) -> Path:
    """`cat` as a container of a demo pod sees it (see the module docstring)."""
    real = shutil.which("cat")
    assert real, "no cat on PATH"
    bin_dir.mkdir(parents=True, exist_ok=True)
    cases = "|".join(f"{p}|{p}/*" for p in POD_PATHS)
    shim = bin_dir / "cat"
    shim.write_text(
        "#!/bin/sh\n"
        "# kubeckpt demo: in a pod root (a KWOK Exec workDir), the pod's mounts live under it.\n"
        f"if [ -f ./{POD_ROOT_MARKER} ]; then\n"
        "  n=$#\n"
        '  while [ "$n" -gt 0 ]; do\n'
        "    a=$1; shift; n=$((n - 1))\n"
        f'    case $a in {cases}) a=".$a" ;; esac\n'
        '    set -- "$@" "$a"\n'
        "  done\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


# --------------------------------------------------------------------------------- the add-on


def local_webhook_configuration(port: int) -> dict:
    """config/webhook's configuration, registered by URL (the webhook runs on this host)."""
    mwc = yaml.safe_load(
        (REPO / "config" / "webhook" / "mutatingwebhookconfiguration.yaml").read_text()
    )
    mwc["metadata"]["name"] = MWC_NAME
    for w in mwc["webhooks"]:
        path = w["clientConfig"]["service"]["path"]
        w["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
    return mwc


def start_webhook(cluster: LocalCluster, logs: Path) -> tuple[subprocess.Popen[bytes], int]:
    """kubeckpt-webhook on 127.0.0.1; it makes its CA and writes the caBundle itself."""
    port = free_port()
    cluster.apply(local_webhook_configuration(port))
    log = logs / "kubeckpt-webhook.log"
    proc = spawn(
        [
            str(VENV_BIN / "kubeckpt-webhook"),
            f"--kubeconfig={cluster.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--port={port}",
            f"--namespace={ADDON_NS}",
            f"--webhook-config={MWC_NAME}",
            "--extra-ip=127.0.0.1",
        ],
        log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # readiness only; the API server verifies with the caBundle

    def ready() -> bool:
        assert proc.poll() is None, f"kubeckpt-webhook exited:\n{tail(log)}"
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2):
            return True

    def ca_published() -> bool:
        mwc = json.loads(
            cluster.kubectl("get", "mutatingwebhookconfiguration", MWC_NAME, "-o", "json").stdout
        )
        return all(w["clientConfig"].get("caBundle") for w in mwc["webhooks"])

    wait_for(ready, "the webhook to be ready", timeout=60)
    wait_for(ca_published, "the caBundle in the webhook configuration", timeout=30)
    return proc, port


def start_reconciler(cluster: LocalCluster, logs: Path) -> tuple[subprocess.Popen[bytes], int]:
    """kubeckpt-reconciler with leader election, polling every 2 s (the demo is short)."""
    port = free_port()
    log = logs / "kubeckpt-reconciler.log"
    proc = spawn(
        [
            str(VENV_BIN / "kubeckpt-reconciler"),
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={ADDON_NS}",
            "--leader-elect",
            "--bind-address=127.0.0.1",
            f"--port={port}",
            # Every 2 s: a short demo needs no less (the default is 15 s for a young job).
            "--poll-early=2",
            "--poll-recent=2",
            "--poll-stale=2",
        ],
        log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )

    def leading() -> bool:
        assert proc.poll() is None, f"kubeckpt-reconciler exited:\n{tail(log)}"
        lease = cluster.kubectl(
            "get", "lease", "kubeckpt-reconciler", "-n", ADDON_NS, "-o", "json", check=False
        )
        if lease.returncode != 0:
            return False
        return bool(json.loads(lease.stdout)["spec"].get("holderIdentity"))

    wait_for(leading, "the reconciler to take its leader-election Lease", timeout=60)
    return proc, port


# ------------------------------------------------------------------------ the stand-in kubelet


def pod_json(cluster: LocalCluster, namespace: str, name: str) -> dict | None:
    p = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None


def to_root(root: Path, value: str) -> str:
    """A pod path under one of POD_PATHS, as this host sees it."""
    for p in POD_PATHS:
        if value == p or value.startswith(p + "/"):
            return str(root) + value
    return value


def resolve_env(pod: dict, container: dict, root: Path) -> tuple[dict[str, str], list[str]]:
    """The container's env as the kubelet would give it (fieldRefs resolved), paths mapped."""
    meta = pod["metadata"]
    fields = {
        "metadata.namespace": meta["namespace"],
        "metadata.name": meta["name"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
    }
    env: dict[str, str] = {}
    skipped: list[str] = []
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = to_root(root, str(e["value"]))
        elif (ref := (e.get("valueFrom") or {}).get("fieldRef")) and ref["fieldPath"] in fields:
            env[e["name"]] = fields[ref["fieldPath"]]
        else:
            skipped.append(e["name"])  # Secret / ConfigMap refs: none in this demo's pods
    # Where the kubelet reads the termination message from (the container's default path).
    env.setdefault(
        "KUBECKPT_TERMINATION_LOG",
        to_root(root, container.get("terminationMessagePath") or TERMINATION_LOG),
    )
    return env, skipped


def exit_code(rc: int) -> int:
    """A container's exit code as the kubelet reports it: 128 + n for death by signal n."""
    return 128 - rc if rc < 0 else rc


class PodProcess:
    """One pod's training container, run as a local process."""

    def __init__(
        self,
        cluster: LocalCluster,
        pod: dict,
        argv: list[str],
        logs: Path,
        echo: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.ns = pod["metadata"]["namespace"]
        self.name = pod["metadata"]["name"]
        self.uid = pod["metadata"]["uid"]
        self.pod = pod
        self.container = next(
            (c for c in pod["spec"]["containers"] if c["name"] == "pytorch"),
            pod["spec"]["containers"][0],
        )
        self.argv = argv
        self.log = logs / f"{self.name}-{self.uid[:8]}.log"
        self.echo = echo
        self.lines: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = Path()
        self.env: dict[str, str] = {}
        self._pump_thread: threading.Thread | None = None

    def start(self) -> None:
        # The pod root is the KWOK Exec workDir: `kubectl exec` into the pod runs there.
        self.root = self.cluster.exec_dir(self.ns, self.name)
        # A new pod gets new emptyDirs: nothing of the previous pod's run dir survives.
        for p in (RUN_DIR, TERMINATION_LOG):
            target = Path(to_root(self.root, p))
            if target.is_dir():
                shutil.rmtree(target)
            target.unlink(missing_ok=True)
        Path(to_root(self.root, RUN_DIR)).mkdir(parents=True)
        Path(to_root(self.root, TERMINATION_LOG)).parent.mkdir(parents=True, exist_ok=True)
        (self.root / POD_ROOT_MARKER).write_text(self.uid)
        (self.root / "exit.json").unlink(missing_ok=True)
        env, _ = resolve_env(self.pod, self.container, self.root)
        self.env = env
        # Like a kubelet's pod: the finalizer holds a deleted pod until the container exited.
        self.cluster.kubectl(
            "patch",
            "pod",
            self.name,
            "-n",
            self.ns,
            "--type=json",
            "-p",
            json.dumps([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]),
        )
        base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.root,
            env={**base, "PYTHONUNBUFFERED": "1", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log.open("ab") as f:
            for raw in self.proc.stdout:
                f.write(raw)
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                self.echo(f"    [{self.name}] {line}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        rc = exit_code(self.proc.wait(timeout))
        self._drain()
        return rc

    def _drain(self) -> None:
        """Every line the process wrote is in `lines` (the pipe is read on a thread)."""
        if self._pump_thread is not None:
            self._pump_thread.join(5)

    def grace_seconds(self) -> int:
        return int(self.pod["spec"].get("terminationGracePeriodSeconds") or 30)

    def kill_sequence(self) -> dict[str, Any]:
        """What the kubelet does for a deleted pod: preStop hook, SIGTERM, wait (grace), SIGKILL."""
        assert self.proc is not None
        grace = self.grace_seconds()
        deadline = time.monotonic() + grace
        out: dict[str, Any] = {"grace": grace}
        hook = ((self.container.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        if hook and self.alive():
            t0 = time.monotonic()
            # The hook runs in the container: its env, its root; kubeckpt-prestop from the image
            # (here: the venv) sees CHECKPOINT_CONTROL_DIR mapped under the pod root.
            env = {"PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", **self.env}
            hook_proc = subprocess.Popen(
                hook["command"],
                cwd=self.root,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
            # The hook ends with its answer, or with the container (an exec into a container
            # that is gone fails), or at the grace period.
            while hook_proc.poll() is None and self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if hook_proc.poll() is None and not self.alive():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    hook_proc.wait(1)  # the answer and the exit come together
            if hook_proc.poll() is None:
                stop_process(hook_proc, timeout=2)
                out["prestop_rc"] = "ended with the container" if not self.alive() else "timeout"
            else:
                out["prestop_rc"] = hook_proc.returncode
            out["prestop_seconds"] = time.monotonic() - t0
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            out["sigterm"] = True
        try:
            rc = self.proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            out["killed"] = True
        out["rc"] = exit_code(rc)
        self._drain()
        return out

    def termination_message(self) -> str:
        try:
            data = Path(to_root(self.root, TERMINATION_LOG)).read_text(errors="replace")
        except OSError:
            return ""
        return data[:MAX_TERMINATION_MESSAGE]

    def exit_info(self) -> dict[str, Any]:
        try:
            return json.loads((self.root / "exit.json").read_text())
        except (OSError, ValueError):
            return {}

    def report_exit(self, rc: int, *, phase: str | None = None) -> None:
        """The container's end in the pod's status, with its termination message.

        Sent at once, from the statuses seen at start (no read first): the reconciler tells a
        just-in-time checkpoint by the termination message that brings it, so the sooner the
        better. The uid in the patch makes it fail rather than touch a same-named new pod.
        """
        statuses = copy.deepcopy((self.pod.get("status") or {}).get("containerStatuses") or [])
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for cs in statuses:
            if cs.get("name") != self.container["name"]:
                continue
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", now)
            cs.update(
                ready=False,
                started=False,
                state={
                    "terminated": {
                        "exitCode": rc,
                        "reason": "Completed" if rc == 0 else "Error",
                        "message": self.termination_message(),
                        "startedAt": started,
                        "finishedAt": now,
                    }
                },
            )
        status: dict[str, Any] = {"containerStatuses": statuses}
        if phase:
            status["phase"] = phase
        self.cluster.kubectl(
            "patch",
            "pod",
            self.name,
            "-n",
            self.ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"uid": self.uid}, "status": status}),
        )

    def release(self) -> None:
        """Drop the finalizer; a deleted pod then goes (KWOK's delete stage removes it)."""
        pod = pod_json(self.cluster, self.ns, self.name)
        if pod is None or pod["metadata"]["uid"] != self.uid:
            return
        rest = [f for f in pod["metadata"].get("finalizers") or [] if f != FINALIZER]
        self.cluster.kubectl(
            "patch",
            "pod",
            self.name,
            "-n",
            self.ns,
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"finalizers": rest or None}}),
            check=False,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
