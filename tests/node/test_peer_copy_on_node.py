"""Issue 28 item 3 on the real node: the demo's two-pod PyTorchJob with peer copies of its ramdisk
tier. The worker pod is lost without notice (every process of the pod SIGKILLed from the host,
then the pod force-deleted, as when its node dies): its ramdisk is gone, the operator creates a
new worker pod, and the job resumes from the worker's copy kept in the master's ramdisk, not from
the persistent tier (which has nothing: its period is out of reach) and not from step 0, and ends
bitwise equal to the same job run without interruption; its TrainingProgress names the tier."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.node import RealNode
from localcluster.pods import running, wait_pod
from tests.support.node_pods import (
    complete_steps,
    diagnose,
    job_succeeded,
    load_demo,
    pod_field,
    progress_record,
)

JOB = "peer-copy"
REFERENCE = "peer-copy-reference"  # the same job, uninterrupted: its final parameters to match
STEPS = 600
LOCAL = "/var/run/kubeckpt/local"
CGROUPS = Path("/sys/fs/cgroup")


@pytest.fixture(scope="module")
def addon(cluster: LocalCluster, real_node: RealNode) -> Iterator[None]:
    kubeckpt_addon.install(cluster)
    try:
        yield
    finally:
        kubeckpt_addon.uninstall(cluster)


def _kill_pod_processes(uid: str) -> int:
    """SIGKILL every process in the pod's cgroups (its containers and its sandbox), as a node
    that dies takes them: no SIGTERM, no preStop, no just-in-time checkpoint."""
    killed = 0
    for cgroup in CGROUPS.glob(f"*/kubepods/**/pod{uid}"):
        for here, _dirs, _files in os.walk(cgroup):
            try:
                pids = Path(here, "cgroup.procs").read_text().split()
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, ValueError):
                    pass
    return killed


def test_a_worker_lost_without_notice_resumes_from_its_copy_in_the_masters_ramdisk(
    cluster: LocalCluster, addon: None, node_ns: str, tmp_path: Path
) -> None:
    demo = load_demo()
    ns = node_ns
    cluster.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    storage = tmp_path / "volume"
    for name in (JOB, REFERENCE):
        (storage / "runs" / ns / name).mkdir(parents=True)
    for p in storage.rglob("*"):
        p.chmod(0o777)
    storage.chmod(0o777)
    cluster.apply(demo.storage_objects(storage, ns))
    script = Path(__file__).resolve().parents[2] / "hack" / "demo" / "train.py"
    cluster.kubectl("create", "configmap", "train", "-n", ns, f"--from-file=train.py={script}")
    cluster.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=x")
    policy = demo.demo_policy(save_steps=1_000_000)  # the persistent tier stays empty
    policy["spec"]["localTier"] = {
        "enabled": True,
        "sizeLimit": "64Mi",
        "periodSteps": 20,
        "peerCopy": True,
    }
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(policy))
    for name in (JOB, REFERENCE):
        job = demo.demo_job(name, STEPS, 0.05, tolerate=True)
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
    master, worker = f"{JOB}-master-0", f"{JOB}-worker-0"
    for pod in (master, worker):
        wait_pod(cluster, ns, pod, running, "running", timeout=180)

    def copied() -> int | None:
        """The newest step that the worker holds, the master holds, and the master keeps the
        worker's copy of (node 1's, in `peers/1/`): what a replacement worker can fetch."""
        own = complete_steps(cluster, ns, worker, LOCAL)
        mine = complete_steps(cluster, ns, master, LOCAL)
        kept = complete_steps(cluster, ns, master, f"{LOCAL}/peers/1")
        common = own & mine & kept
        return max(common) if common and max(common) >= 40 else None

    at_kill = wait_for(copied, "the worker's copy in the master's ramdisk", timeout=240)
    uid = pod_field(cluster, ns, worker, "{.metadata.uid}")
    assert _kill_pod_processes(uid) > 0, f"no process found in the cgroups of pod {uid}"
    cluster.kubectl("delete", "pod", worker, "-n", ns, "--grace-period=0", "--force")

    def replaced() -> bool:
        new = pod_field(cluster, ns, worker, "{.metadata.uid}")
        return bool(new) and new != uid

    wait_for(replaced, "a new worker pod", timeout=120)
    wait_pod(cluster, ns, worker, running, "running", timeout=180)

    def resumed() -> dict | None:
        rec = progress_record(cluster, ns, master)
        return rec if rec.get("resumedFrom") else None

    try:
        # Long: twice in 43 runs the job had not resumed after 240 s (not yet diagnosed; a
        # kubelet restart back-off between the two pods' restarts is one candidate).
        rec = wait_for(resumed, "the job to resume", timeout=480)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{diagnose(cluster, ns, (master, worker))}") from None
    logs = "\n".join(
        cluster.kubectl("logs", p, "-n", ns, "-c", "pytorch", "--tail=40", check=False).stdout
        for p in (master, worker)
    )
    tier = (rec.get("checkpointing") or {}).get("resumedTier")
    assert tier == "local (peer copy)", (rec, logs)
    step = int(rec["resumedFrom"].split("-")[1])
    assert step >= at_kill, (step, at_kill)  # no older than what both ramdisks held then

    digests = {}
    for name in (JOB, REFERENCE):
        wait_for(lambda n=name: job_succeeded(cluster, ns, n), f"{name} to succeed", timeout=300)
        out = cluster.kubectl("logs", f"{name}-master-0", "-n", ns, "-c", "pytorch").stdout
        assert f"finished at step {STEPS}" in out, out[-2000:]
        digests[name] = re.findall(r"final parameters sha256 (\w+)", out)
    assert digests[JOB] and digests[JOB] == digests[REFERENCE], digests
    tp = json.loads(cluster.kubectl("get", "tp", JOB, "-n", ns, "-o", "json").stdout)
    assert tp["status"]["checkpointing"].get("resumedTier") == "local (peer copy)", tp["status"]
