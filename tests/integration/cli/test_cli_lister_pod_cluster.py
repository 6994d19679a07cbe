"""`kubeckpt checkpoints JOB` for a job with no running rank-0 pod, against the local control
plane: the lister pod the CLI creates (what it may do, what it mounts, its deadline), its
deletion when the listing fails, leftovers of an earlier run, and the errors when no lister pod
can help; for an s3:// policy, the pod with the policy Secret's keys by reference, its log (the
listing of a real bucket, the session's SeaweedFS) as the table, and an image without s3fs named.
KWOK runs no containers (the pod never ends here unless a test ends it): the listing in a real
pod, after a job succeeded and after it was deleted, is tests/node/test_cli_on_node.py's (PVC)
and tests/node/test_s3_on_node.py's (s3://)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from kubeckpt_cli.lister_pod import JOB_LABEL, LISTER_LABEL
from localcluster import LocalCluster, wait_for
from localcluster.seaweedfs import SeaweedFS
from tests.support.cli_objects import POLICY, REPO, run_cli, tp, training_status
from tests.support.node_pods import load_demo
from tests.support.s3 import BUCKET
from trainer_runtime.contract import build_manifest
from trainer_runtime.storage import LocalTier, S3Tier

pytestmark = pytest.mark.timeout(300)

STORAGE_HINT = "; or pass --storage PATH with the storage mounted here\n"
LISTER_HINT = (
    ": listing without a running pod creates a short-lived pod in the namespace (it needs create, "
    f"get, list and delete on pods and get on pods/log){STORAGE_HINT}"
)


def kubeckpt(cluster: LocalCluster, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run_cli("--kubeconfig", str(cluster.kubeconfig), *args, **kw)


def apply_policy(cluster: LocalCluster, ns: str, name: str, uri: str) -> None:
    policy = copy.deepcopy(POLICY)
    policy["metadata"] = {"name": name, "namespace": ns}
    policy["spec"]["storage"]["uri"] = uri
    cluster.apply(policy)


def finished_job(
    cluster: LocalCluster, ns: str, job: str, latest: str | None = None, reason: str | None = None
) -> None:
    """A TrainingProgress as a succeeded job leaves it: its pod gone, its latest checkpoint."""
    cluster.apply(tp(job, ns))
    status = training_status(100, observedPod=f"{job}-master-0")
    status["checkpointing"]["latestCheckpoint"] = (
        latest or f"/mnt/kubeckpt/{ns}/{job}/checkpoint-100"
    )
    if reason:
        status["checkpointing"]["latestCheckpointReason"] = reason
    cluster.kubectl(
        "patch", "tp", job, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip


def lister_pods(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"{LISTER_LABEL}=true", "-o", "json")
    return {p["metadata"]["name"]: p for p in json.loads(out.stdout)["items"]}


def unschedulable_lister(cluster: LocalCluster, ns: str, name: str, phase: str | None) -> None:
    """A lister pod as another run of the CLI left it (or has it in flight)."""
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {LISTER_LABEL: "true"}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "no-such-node"},
                "containers": [{"name": "list", "image": "x"}],
            },
        }
    )
    if phase:
        cluster.kubectl(
            "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": phase}}),
        )  # fmt: skip


def start_cli(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'hack'}"}
    return subprocess.Popen(
        [sys.executable, "-m", "kubeckpt_cli", "--kubeconfig", str(cluster.kubeconfig), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_the_lister_pod_for_a_finished_job(cluster: LocalCluster, namespace: str) -> None:
    apply_policy(cluster, namespace, "team-default", "pvc://ckpt/runs")
    finished_job(cluster, namespace, "llama")
    unschedulable_lister(cluster, namespace, "kubeckpt-ls-old", "Failed")  # left behind
    unschedulable_lister(cluster, namespace, "kubeckpt-ls-inflight", None)  # someone's, now

    proc = start_cli(
        cluster, "checkpoints", "llama", "-n", namespace, "--timeout", "8", "--image", "lister:1"
    )
    created: dict[str, Any] = {}

    def appears() -> bool:
        for pod in lister_pods(cluster, namespace).values():
            if pod["metadata"]["labels"].get(JOB_LABEL) == "llama":
                created.update(pod)
        return bool(created)

    try:
        wait_for(appears, "the lister pod", timeout=30)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    name = created["metadata"]["name"]
    assert name.startswith("kubeckpt-ls-llama-")

    # What it may do: read the job's own directory, as the training pod had it, and no more
    spec = created["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 8
    assert spec["securityContext"]["runAsNonRoot"] is True
    (c,) = spec["containers"]
    assert c["image"] == "lister:1"
    assert c["command"][:5] == [
        "python3", "-m", "trainer_runtime.listing",
        "--persistent", f"/mnt/kubeckpt/{namespace}/llama",
    ]  # fmt: skip
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["limits"]["memory"] == "256Mi"
    (mount,) = c["volumeMounts"]
    assert mount["subPath"] == f"runs/{namespace}/llama" and mount["readOnly"] is True
    (volume,) = spec["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "ckpt", "readOnly": True}

    # KWOK never runs it (and the claim does not exist): bounded by --timeout, then deleted
    assert proc.returncode == 1, err
    lines = err.splitlines()
    assert lines[0] == (
        f'kubeckpt: cannot list the checkpoints of "llama": its pod llama-master-0 is gone: '
        f"listing through lister pod {name} (lister:1)"
    )
    assert lines[1].startswith(f"kubeckpt: lister pod {name} did not finish in 8s (")
    assert err.endswith(STORAGE_HINT) and len(lines) == 2 and out == ""

    def cleaned() -> bool:
        return set(lister_pods(cluster, namespace)) == {"kubeckpt-ls-inflight"}

    wait_for(cleaned, "the lister pod and the leftover to be deleted", timeout=30)


def test_when_no_lister_pod_can_help(cluster: LocalCluster, namespace: str, tmp_path: Path) -> None:
    # A deleted job: its TrainingProgress went with it; without --kind, say what to give
    gone = kubeckpt(cluster, "checkpoints", "gone", "-n", namespace)
    assert gone.returncode == 3
    assert gone.stderr.endswith(
        "for a deleted job, name its --kind (a lister pod then mounts the storage), or pass "
        "--storage PATH with the storage mounted here\n"
    )
    # With --kind, but no policy says where its storage is
    kind = kubeckpt(cluster, "checkpoints", "gone", "-n", namespace, "--kind", "PyTorchJob")
    assert kind.returncode == 3
    assert kind.stderr == (
        'kubeckpt: cannot list the checkpoints of "gone": it has no TrainingProgress, and no '
        f'lister pod can mount its storage: no usable CheckpointPolicy in namespace "{namespace}" '
        "says where; pass --storage PATH with the storage mounted here\n"
    )
    # A path of the training pod's own filesystem: no other pod reaches it
    apply_policy(cluster, namespace, "local", "file:///data/ckpt")
    finished_job(cluster, namespace, "bert")
    local = kubeckpt(cluster, "checkpoints", "bert", "-n", namespace)
    assert local.returncode == 3
    assert (
        'CheckpointPolicy "local" has file:///data/ckpt: file:// storage is only inside the '
        "training pod; pass --storage PATH" in local.stderr
    )
    assert f"the latest checkpoint recorded is /mnt/kubeckpt/{namespace}/bert/checkpoint-100" in (
        local.stderr
    )
    assert lister_pods(cluster, namespace) == {}

    # A user who may read but not create pods: the lister's rights, named
    cluster.kubectl("delete", "checkpointpolicy", "local", "-n", namespace)
    apply_policy(cluster, namespace, "pvc", "pvc://ckpt/runs")
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    kc = cluster.token_kubeconfig(tmp_path / "reader", "reader", namespace)
    for resource in ("trainingprogresses.kubeckpt.io", "checkpointpolicies.kubeckpt.io", "pods"):
        role = resource.split(".")[0]
        cluster.kubectl(
            "create", "role", role, "-n", namespace, "--verb=get,list", f"--resource={resource}"
        )
        cluster.kubectl(
            "create", "rolebinding", role, "-n", namespace, f"--role={role}",
            f"--serviceaccount={namespace}:reader",
        )  # fmt: skip

    def denied() -> subprocess.CompletedProcess[str]:
        return run_cli("--kubeconfig", str(kc), "checkpoints", "bert", "-n", namespace)

    wait_for(lambda: "cannot create pods" in denied().stderr, "the RoleBindings", timeout=30)
    proc = denied()
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[1].startswith(
        f'kubeckpt: forbidden: you cannot create pods in namespace "{namespace}"'
    )
    assert proc.stderr.endswith(LISTER_HINT)
    assert lister_pods(cluster, namespace) == {}


def test_the_lister_pods_log_is_the_table(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """The CLI's side of a listing that ends: KWOK runs the pod (its claim bound), this test ends
    it as the kubelet would and serves its log (KWOK's Logs: the listing's real output)."""
    volume = tmp_path / "volume"
    volume.mkdir()
    cluster.apply(load_demo().storage_objects(volume, namespace))
    apply_policy(cluster, namespace, "team-default", "pvc://checkpoints/runs")
    finished_job(cluster, namespace, "llama")
    job_dir = tmp_path / "job"
    tier = LocalTier(job_dir, "persistent")
    for step, extra in ((10, {"reason": "periodic"}), (20, {})):
        d = tier.begin(step)
        (d / "model.pt").write_bytes(b"m" * 1024)
        tier.commit(step, build_manifest(
            d, step=step, epoch=0, world_size=1, framework="torch", tier="persistent", extra=extra
        ))  # fmt: skip
    log = tmp_path / "listing.log"
    listed = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.listing", "--persistent", str(job_dir)],
        capture_output=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    # KWOK serves the file in the container runtime's log format, as the kubelet reads it
    log.write_bytes(b"2026-03-01T12:00:00.000000000Z stdout F " + listed.stdout)

    proc = start_cli(cluster, "checkpoints", "llama", "-n", namespace, "--timeout", "60")
    name: list[str] = []

    def running_on_kwok() -> bool:
        for pod in lister_pods(cluster, namespace).values():
            if (pod.get("status") or {}).get("phase") == "Running":
                name.append(pod["metadata"]["name"])
                return True
        return False

    try:
        wait_for(running_on_kwok, "the lister pod to run", timeout=40)
        cluster.apply(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Logs",
                "metadata": {"name": name[0], "namespace": namespace},
                "spec": {"logs": [{"containers": ["list"], "logsFile": str(log)}]},
            }
        )
        ended = {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "list",
                    "image": "x",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
            ],
        }
        cluster.kubectl(
            "patch", "pod", name[0], "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": ended}),
        )  # fmt: skip
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    rows = [ln.split()[:5] for ln in out.splitlines()]
    assert rows == [
        ["TIER", "CHECKPOINT", "STEP", "STATE", "REASON"],
        ["persistent", "checkpoint-20", "20", "complete", "-"],
        ["persistent", "checkpoint-10", "10", "complete", "periodic"],
    ]
    wait_for(lambda: lister_pods(cluster, namespace) == {}, "the lister pod to go", timeout=30)


def end_on_kwok(cluster: LocalCluster, ns: str, name: str, listing: bytes, tmp_path: Path) -> None:
    """End a running lister pod as the kubelet would, its log the listing's output (KWOK's
    Logs serves a file in the container runtime's log format, as the kubelet reads it)."""
    log = tmp_path / f"{name}.log"
    log.write_bytes(b"2026-03-01T12:00:00.000000000Z stdout F " + listing)
    cluster.apply(
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"logs": [{"containers": ["list"], "logsFile": str(log)}]},
        }
    )
    ended = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": "list",
                "image": "x",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
        ],
    }
    cluster.kubectl(
        "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": ended}),
    )  # fmt: skip


def list_through_kwok(
    cluster: LocalCluster, ns: str, job: str, listing: bytes, tmp_path: Path
) -> tuple[subprocess.Popen[str], dict[str, Any], str, str]:
    """`kubeckpt checkpoints JOB`, its lister pod ended on KWOK with `listing` as its log:
    (the finished CLI, the pod as it ran, stdout, stderr)."""
    proc = start_cli(
        cluster, "checkpoints", job, "-n", ns, "--timeout", "60", "--image", "lister:1"
    )
    running: dict[str, Any] = {}

    def runs_on_kwok() -> bool:
        for pod in lister_pods(cluster, ns).values():
            if (pod.get("status") or {}).get("phase") == "Running":
                running.update(pod)
                return True
        return False

    try:
        wait_for(runs_on_kwok, "the lister pod to run", timeout=40)
        end_on_kwok(cluster, ns, running["metadata"]["name"], listing, tmp_path)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc, running, out, err


def test_the_lister_pod_for_a_job_on_s3(
    cluster: LocalCluster,
    namespace: str,
    seaweedfs: SeaweedFS,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """An s3:// policy: the pod reaches the bucket with the policy Secret's keys, by reference
    (the CLI never reads the Secret), and shows the bucket's checkpoints with their REASONs;
    an image without s3fs is named."""
    prefix = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    uri = f"{prefix}/{namespace}/llama"
    secret = seaweedfs.secret("s3-credentials")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(secret))
    policy = copy.deepcopy(POLICY)
    policy["metadata"] = {"name": "s3", "namespace": namespace}
    policy["spec"]["storage"] = {"uri": prefix, "secretRef": {"name": "s3-credentials"}}
    cluster.apply(policy)
    # A PVC policy beside it: the recorded latest checkpoint says which one held the job's
    apply_policy(cluster, namespace, "pvc", "pvc://ckpt/runs")
    finished_job(cluster, namespace, "llama", latest=f"{uri}/checkpoint-20", reason="jit")
    # The job's checkpoints, written by the runtime's S3 tier as the training pod wrote them
    aws = seaweedfs.aws_env()
    for key, value in aws.items():
        monkeypatch.setenv(key, value)
    tier = S3Tier(uri, tmp_path / "staging")
    for step, extra in ((10, {"reason": "periodic"}), (20, {})):
        d = tier.begin(step)
        (d / "model.pt").write_bytes(b"m" * 64)
        tier.publish(step, ["model.pt"])
        tier.commit(step, build_manifest(
            d, step=step, epoch=0, world_size=1, framework="torch", tier=tier.name, extra=extra
        ))  # fmt: skip
    # What the pod's listing prints, with the Secret's keys in its env as the kubelet sets them
    listed = subprocess.run(
        [sys.executable, "-m", "trainer_runtime.listing", "--persistent", uri],
        capture_output=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), **aws},
    ).stdout  # fmt: skip

    proc, pod, out, err = list_through_kwok(cluster, namespace, "llama", listed, tmp_path)
    assert proc.returncode == 0, err
    rows = [ln.split()[:5] for ln in out.splitlines()]
    assert rows == [
        ["TIER", "CHECKPOINT", "STEP", "STATE", "REASON"],
        ["persistent", "checkpoint-20", "20", "complete", "jit"],  # from the TrainingProgress
        ["persistent", "checkpoint-10", "10", "complete", "periodic"],
    ]
    # What it could do: reach the job's prefix with the Secret's keys, nothing more
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["activeDeadlineSeconds"] == 60 and spec["restartPolicy"] == "Never"
    (c,) = spec["containers"]
    assert c["command"][:5] == ["python3", "-m", "trainer_runtime.listing", "--persistent", uri]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "volumes" not in spec and "volumeMounts" not in c
    refs = {e["name"]: e for e in c["env"] if e["name"] != "PYTHONDONTWRITEBYTECODE"}
    assert set(aws) <= set(refs)
    for e in refs.values():
        assert e["valueFrom"]["secretKeyRef"]["name"] == "s3-credentials" and "value" not in e
    text = json.dumps(pod)
    assert aws["AWS_SECRET_ACCESS_KEY"] not in text and aws["AWS_ACCESS_KEY_ID"] not in text
    wait_for(lambda: lister_pods(cluster, namespace) == {}, "the lister pod to go", timeout=30)

    # An image whose Python has no s3fs: named, with what to do (-S: no site-packages here)
    bare = subprocess.run(
        [sys.executable, "-S", "-m", "trainer_runtime.listing", "--persistent", uri],
        capture_output=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), **aws},
    ).stdout  # fmt: skip
    proc, pod, out, err = list_through_kwok(cluster, namespace, "llama", bare, tmp_path)
    name = pod["metadata"]["name"]
    assert proc.returncode == 1 and out == "", (out, err)
    assert err.splitlines()[-1] == (
        f"kubeckpt: the image of lister pod {name}, lister:1, has no fsspec/s3fs to read {uri}: "
        "pass --image with one that has them (kubeckpt's runtime image, or the job's own "
        "training image)"
    )
    wait_for(lambda: lister_pods(cluster, namespace) == {}, "the lister pod to go", timeout=30)
