"""What kubeckpt relies on from a kubelet, on the real node: cluster DNS and the API server
through its Service, a `medium: Memory` emptyDir that is a tmpfs of its sizeLimit, the
termination message, exec through the container runtime, a shell PID 1 that forwards no signal
(the preStop hook is then the only way to stop the training process cleanly), and a clear error
for an image that is not there."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from localcluster import LocalCluster
from localcluster.pods import PodNotStarting, container_terminated, running, terminated, wait_pod
from tests.support.node_pods import RUNTIME_IMAGE, pod

pytestmark = pytest.mark.timeout(300)


def create(cluster: LocalCluster, ns: str, manifest: dict) -> None:
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))


def python_pod(name: str, script: str, **spec: object) -> dict:
    return pod(
        name,
        [{"name": "main", "image": RUNTIME_IMAGE, "command": ["python", "-c", script]}],
        restartPolicy="Never",
        **spec,
    )


def test_pod_resolves_services_and_reaches_the_api_server(cluster: LocalCluster, node_ns: str):
    # What our controllers' in-cluster configuration and the training-operator's MASTER_ADDR need;
    # a name outside the cluster must not resolve (CoreDNS has no upstream).
    script = textwrap.dedent(
        """
        import json, socket, ssl, urllib.request
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        ip = socket.gethostbyname("kubernetes.default.svc.cluster.local")
        ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
        req = urllib.request.Request("https://kubernetes.default.svc/version",
            headers={"Authorization": "Bearer " + open(sa + "/token").read()})
        version = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"]
        try:
            socket.gethostbyname("example.com")
            outside = "resolved"
        except OSError:
            outside = "unresolved"
        print(json.dumps({"ip": ip, "version": version, "outside": outside}))
        """
    )
    create(cluster, node_ns, python_pod("dns", script))
    wait_pod(cluster, node_ns, "dns", terminated, "terminated", timeout=90)
    out = json.loads(cluster.kubectl("logs", "dns", "-n", node_ns).stdout.strip().splitlines()[-1])
    assert out["ip"] == "10.96.0.1"
    assert out["version"].startswith("v1.")
    assert out["outside"] == "unresolved"


def test_memory_emptydir_is_a_tmpfs_with_its_size_limit(cluster: LocalCluster, node_ns: str):
    spec = python_pod("ram", "import time; time.sleep(600)")
    spec["spec"]["containers"][0]["volumeMounts"] = [{"name": "ram", "mountPath": "/ram"}]
    spec["spec"]["volumes"] = [
        {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}
    ]
    spec["spec"]["terminationGracePeriodSeconds"] = 1
    create(cluster, node_ns, spec)
    wait_pod(cluster, node_ns, "ram", running, "running", timeout=90)
    mounts = cluster.kubectl("exec", "ram", "-n", node_ns, "--", "cat", "/proc/mounts").stdout
    ram = [line.split() for line in mounts.splitlines() if line.split()[1] == "/ram"]
    assert ram and ram[0][2] == "tmpfs", mounts
    assert "size=16384k" in ram[0][3]
    # Writing past the limit fails with ENOSPC (what a full ramdisk tier looks like to a save).
    fill = cluster.kubectl(
        "exec",
        "ram",
        "-n",
        node_ns,
        "--",
        "python",
        "-c",
        "import os\nf = open('/ram/x', 'wb')\n"
        "try:\n    [f.write(b'0' * 2**20) or f.flush() for _ in range(20)]\n"
        "except OSError as e:\n    print('errno', e.errno)\n",
        check=False,
    )
    assert "errno 28" in fill.stdout, fill.stdout + fill.stderr


def test_termination_message_is_read_after_exit(cluster: LocalCluster, node_ns: str):
    script = "open('/dev/termination-log', 'w').write('{\"step\": 42}'); raise SystemExit(3)"
    create(cluster, node_ns, python_pod("msg", script))
    p = wait_pod(cluster, node_ns, "msg", terminated, "terminated", timeout=90)
    state = container_terminated(p, "main")
    assert state is not None
    assert state["exitCode"] == 3
    assert json.loads(state["message"]) == {"step": 42}


HOLD = "kubeckpt.io/test-hold"
SHELL_PID1 = textwrap.dedent(
    """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *_: (print("child: SIGTERM", flush=True), sys.exit(0)))
    print("child: started", flush=True)
    while not os.path.exists("/tmp/stop"):
        time.sleep(0.1)
    open("/dev/termination-log", "w").write("stopped by preStop")
    print("child: stopped by the preStop request", flush=True)
    """
)


def shell_pid1_pod(name: str, *, prestop: bool) -> dict:
    # `bash -c "python ..."`: bash is PID 1 and forwards no SIGTERM to its child (the child is
    # not exec'd because a second command follows it).
    container = {
        "name": "main",
        "image": RUNTIME_IMAGE,
        "command": ["bash", "-c", f"python -c '{SHELL_PID1}'; echo bash: child exited $?"],
    }
    if prestop:
        container["lifecycle"] = {"preStop": {"exec": {"command": ["touch", "/tmp/stop"]}}}
    manifest = pod(name, [container], restartPolicy="Never", terminationGracePeriodSeconds=4)
    # Held by a finalizer, the deleted pod keeps its final status for the test to read.
    manifest["metadata"]["finalizers"] = [HOLD]
    return manifest


@pytest.mark.parametrize("prestop", [False, True], ids=["sigterm-only", "prestop"])
def test_shell_pid1_forwards_no_signal_and_prestop_saves_the_run(
    cluster: LocalCluster, node_ns: str, prestop: bool
):
    name = "pre" if prestop else "sig"
    create(cluster, node_ns, shell_pid1_pod(name, prestop=prestop))
    wait_pod(
        cluster,
        node_ns,
        name,
        lambda p: (
            running(p)
            and "child: started" in cluster.kubectl("logs", name, "-n", node_ns, check=False).stdout
        ),
        "running its child",
        timeout=90,
    )
    t0 = time.monotonic()
    cluster.kubectl("delete", "pod", name, "-n", node_ns, "--wait=false")
    p = wait_pod(cluster, node_ns, name, terminated, "terminated", timeout=30)
    took = time.monotonic() - t0
    cluster.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        node_ns,
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/finalizers"}]',
    )
    final = container_terminated(p, "main")
    assert final is not None
    if prestop:
        assert final["exitCode"] == 0, final
        assert final.get("message") == "stopped by preStop"
        assert took < 4, took  # well inside the grace period
    else:
        # SIGTERM went to bash, which ignored it as PID 1: the child ran on until SIGKILL.
        assert final["exitCode"] == 137, final
        assert took >= 3.5, took


def test_missing_image_fails_at_once_naming_it(cluster: LocalCluster, node_ns: str):
    create(
        cluster,
        node_ns,
        pod("noimg", [{"name": "main", "image": "kubeckpt.local/not-built:1", "command": ["x"]}]),
    )
    t0 = time.monotonic()
    with pytest.raises(PodNotStarting) as e:
        wait_pod(cluster, node_ns, "noimg", running, "running", timeout=60)
    assert time.monotonic() - t0 < 30
    assert "kubeckpt.local/not-built:1" in str(e.value)
    assert "make images" in str(e.value)
