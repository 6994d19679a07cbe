"""Issue 28 item 3 on the real node: the demo's two-pod PyTorchJob with peer copies of its ramdisk
tier. The worker pod is lost without notice (every process of the pod SIGKILLed from the host,
then the pod force-deleted, as when its node dies): its ramdisk is gone, the operator creates a
new worker pod, and the job resumes from the worker's copy kept in the master's ramdisk, not from
the persistent tier (which has nothing: its period is out of reach) and not from step 0, and ends
bitwise equal to the same job run without interruption; its TrainingProgress names the tier."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.node import RealNode
from localcluster.pods import running, wait_pod
from tests.support.node_pods import (
    demo_namespace,
    load_demo,
    peer_copy_policy,
    pod_field,
    same_final_parameters,
    wait_resumed,
    worker_copy_kept,
)

JOB = "peer-copy"
REFERENCE = "peer-copy-reference"  # the same job, uninterrupted: its final parameters to match
STEPS = 600
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
    demo_namespace(cluster, ns, tmp_path, peer_copy_policy(), [JOB, REFERENCE])
    for name in (JOB, REFERENCE):
        job = demo.demo_job(name, STEPS, 0.05, tolerate=True)
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
    master, worker = f"{JOB}-master-0", f"{JOB}-worker-0"
    for pod in (master, worker):
        wait_pod(cluster, ns, pod, running, "running", timeout=180)

    at_kill = wait_for(
        lambda: worker_copy_kept(cluster, ns, JOB),
        "the worker's copy in the master's ramdisk",
        timeout=240,
    )
    uid = pod_field(cluster, ns, worker, "{.metadata.uid}")
    assert _kill_pod_processes(uid) > 0, f"no process found in the cgroups of pod {uid}"
    cluster.kubectl("delete", "pod", worker, "-n", ns, "--grace-period=0", "--force")

    def replaced() -> bool:
        new = pod_field(cluster, ns, worker, "{.metadata.uid}")
        return bool(new) and new != uid

    wait_for(replaced, "a new worker pod", timeout=120)
    wait_pod(cluster, ns, worker, running, "running", timeout=180)

    rec = wait_resumed(cluster, ns, JOB)
    logs = "\n".join(
        cluster.kubectl("logs", p, "-n", ns, "-c", "pytorch", "--tail=40", check=False).stdout
        for p in (master, worker)
    )
    tier = (rec.get("checkpointing") or {}).get("resumedTier")
    assert tier == "local (peer copy)", (rec, logs)
    step = int(rec["resumedFrom"].split("-")[1])
    assert step >= at_kill, (step, at_kill)  # no older than what both ramdisks held then

    same_final_parameters(cluster, ns, (JOB, REFERENCE), STEPS)
    tp = json.loads(cluster.kubectl("get", "tp", JOB, "-n", ns, "-o", "json").stdout)
    assert tp["status"]["checkpointing"].get("resumedTier") == "local (peer copy)", tp["status"]
