"""Issue 28 item 2: a second real node (its own kubelet, containerd and image store, bridge and
pod subnet, cgroup parent; hack/localcluster/node.py) and the demo's two-rank PyTorchJob with one
rank on each node, DDP over the pod network between the two subnets.

- `kubectl drain` of the worker's node: the worker is evicted (SIGTERM, preStop, a just-in-time
  checkpoint on both ranks), its new pod goes to the other node (the drained one is cordoned), and
  both ranks resume at the just-in-time step from the persistent tier.
- The worker's node dies (kubelet, containerd, shims and every process of its pods SIGKILLed, no
  drain, no preStop) and its Node object is deleted, as a cloud provider's node controller does for
  a machine that is gone; pod garbage collection removes the worker pod, the operator creates it
  again on the surviving node, and it restores its part from its copy in the master's ramdisk on
  that node (the peer copy), the newest complete checkpoint that survived.

Each ends bitwise equal to the same job run without interruption, and its TrainingProgress names
the tier it resumed from. Both nodes share this host's kernel: the dead node's connections are
closed at once (a machine that vanishes leaves them to the training's collective timeout), and the
PersistentVolume is a host directory both nodes mount, as a shared filesystem would be.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import LocalCluster, wait_for
from localcluster import addon as kubeckpt_addon
from localcluster.images import MissingImages
from localcluster.node import NodeUnavailable, RealNode, cgroup_pids
from localcluster.pods import running, wait_pod
from tests.support.node_pods import (
    demo_namespace,
    diagnose,
    load_demo,
    peer_copy_policy,
    pod_field,
    progress_record,
    same_final_parameters,
    wait_resumed,
    worker_copy_kept,
)

JOB = "two-nodes"
REFERENCE = "two-nodes-reference"  # the same job, uninterrupted, all on node 0
HOSTNAME = "kubernetes.io/hostname"
RESUMED = re.compile(r"resumed from (checkpoint-(\d+)) at step (\d+)")


@pytest.fixture(scope="module")
def addon(cluster: LocalCluster, real_node: RealNode) -> Iterator[None]:
    """Installed before the second node exists, so the add-on's pods run on node 0, which the
    tests never take away."""
    kubeckpt_addon.install(cluster)
    try:
        yield
    finally:
        kubeckpt_addon.uninstall(cluster)


@pytest.fixture
def second_node(cluster: LocalCluster, addon: None) -> Iterator[RealNode]:
    try:
        node = cluster.add_real_node()
    except (NodeUnavailable, MissingImages) as e:
        pytest.fail(f"no second real node: {e}", pytrace=False)
    try:
        yield node
    finally:
        cluster.remove_real_node(node)


def _place(job: dict[str, Any], master_on: str, worker_prefers: str) -> dict[str, Any]:
    """The master on node `master_on`; the worker preferably on `worker_prefers` (only
    preferably: when that node is gone or cordoned, it goes wherever it fits)."""
    specs = job["spec"]["pytorchReplicaSpecs"]
    specs["Master"]["template"]["spec"]["nodeSelector"][HOSTNAME] = master_on
    specs["Worker"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {"key": HOSTNAME, "operator": "In", "values": [worker_prefers]}
                        ]
                    },
                }
            ]
        }
    }
    return job


def _start_jobs(
    cluster: LocalCluster,
    ns: str,
    tmp_path: Path,
    policy: dict[str, Any],
    steps: int,
    node0: str,
    node1: str,
) -> Path:
    """The PV, the script, the policy; JOB across both nodes and REFERENCE on node 0. Returns
    the PersistentVolume's host directory."""
    demo = load_demo()
    storage = demo_namespace(cluster, ns, tmp_path, policy, [JOB, REFERENCE])
    job = _place(demo.demo_job(JOB, steps, 0.05, tolerate=True), node0, node1)
    reference = _place(demo.demo_job(REFERENCE, steps, 0.05, tolerate=True), node0, node0)
    for obj in (job, reference):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))
    for name in (JOB, REFERENCE):
        for pod in _pods(name):
            wait_pod(cluster, ns, pod, running, "running", timeout=180)
    placed = {p: pod_field(cluster, ns, p, "{.spec.nodeName}") for p in _pods(JOB)}
    assert placed == dict(zip(_pods(JOB), (node0, node1), strict=True)), placed
    return storage


def _pods(job: str) -> tuple[str, str]:
    return f"{job}-master-0", f"{job}-worker-0"


def _replaced_on(cluster: LocalCluster, ns: str, pod: str, uid: str, node: str) -> None:
    """`pod` is a new pod (not `uid`), running, on `node`."""
    wait_for(
        lambda: pod_field(cluster, ns, pod, "{.metadata.uid}") not in ("", uid),
        f"a new {pod}",
        timeout=180,
    )
    wait_pod(cluster, ns, pod, running, "running", timeout=180)
    assert pod_field(cluster, ns, pod, "{.spec.nodeName}") == node


def _alive(pid: int) -> bool:
    """Running: neither gone nor a zombie waiting for its (new) parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _tier(cluster: LocalCluster, ns: str) -> str | None:
    tp = json.loads(cluster.kubectl("get", "tp", JOB, "-n", ns, "-o", "json").stdout)
    return ((tp.get("status") or {}).get("checkpointing") or {}).get("resumedTier")


def test_a_drained_node_moves_its_rank_and_the_job_resumes_at_the_jit_step(
    cluster: LocalCluster, second_node: RealNode, node_ns: str, tmp_path: Path
) -> None:
    ns, steps = node_ns, 400
    node0, node1 = cluster.real_node_list[0].name, second_node.name
    policy = load_demo().demo_policy(save_steps=1_000_000)  # only the just-in-time save
    storage = _start_jobs(cluster, ns, tmp_path, policy, steps, node0, node1)
    master, worker = _pods(JOB)
    before = wait_for(
        lambda: (s := int(progress_record(cluster, ns, master).get("step") or 0)) >= 40 and s,
        "the job to reach step 40",
        timeout=240,
    )
    uid = pod_field(cluster, ns, worker, "{.metadata.uid}")
    try:
        cluster.kubectl(
            "drain", node1, "--pod-selector", f"training.kubeflow.org/job-name={JOB}",
            "--delete-emptydir-data", "--ignore-daemonsets", "--timeout=300s", timeout=320,
        )  # fmt: skip
        _replaced_on(cluster, ns, worker, uid, node0)

        def resumed() -> dict[str, re.Match[str]] | None:
            found = {}
            for pod in (master, worker):
                out = cluster.kubectl("logs", pod, "-n", ns, "-c", "pytorch", check=False).stdout
                if m := RESUMED.search(out):
                    found[pod] = m
            return found if len(found) == 2 else None

        try:
            found = wait_for(resumed, "both ranks to resume", timeout=240)
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{diagnose(cluster, ns, (master, worker))}") from None
        at = {pod: (int(m.group(2)), int(m.group(3))) for pod, m in found.items()}
        jit_step = at[master][0]
        assert set(at.values()) == {(jit_step, jit_step)}, at  # one step, on both ranks
        assert jit_step >= before, (jit_step, before)  # no step lost
        assert (storage / "runs" / ns / JOB / f"checkpoint-{jit_step}" / "manifest.json").is_file()
        same_final_parameters(cluster, ns, (JOB, REFERENCE), steps)
        assert _tier(cluster, ns) == "persistent"
    finally:
        cluster.kubectl("uncordon", node1, check=False)


def test_a_dead_node_takes_a_rank_and_the_job_resumes_from_the_peer_copy_on_the_other_node(
    cluster: LocalCluster, second_node: RealNode, node_ns: str, tmp_path: Path
) -> None:
    ns, steps = node_ns, 600
    node0, node1 = cluster.real_node_list[0].name, second_node.name
    _start_jobs(cluster, ns, tmp_path, peer_copy_policy(), steps, node0, node1)
    worker = _pods(JOB)[1]
    at_loss = wait_for(
        lambda: worker_copy_kept(cluster, ns, JOB), "the worker's copy on node 0", timeout=240
    )
    uid = pod_field(cluster, ns, worker, "{.metadata.uid}")
    pids = cgroup_pids(second_node.pod_cgroups)
    assert pids, f"no process in {node1}'s pod cgroups while its worker trains"
    second_node.power_off()
    assert not [p for p in pids if _alive(p)], "the dead node's pods kept processes"
    assert not any(p.alive() for p in second_node.procs.values()), "its kubelet or containerd"
    cluster.kubectl("delete", "node", node1)
    _replaced_on(cluster, ns, worker, uid, node0)  # after pod GC's quarantine (40 s)

    rec = wait_resumed(cluster, ns, JOB)
    assert (rec.get("checkpointing") or {}).get("resumedTier") == "local (peer copy)", rec
    step = int(rec["resumedFrom"].split("-")[1])
    assert step >= at_loss, (step, at_loss)
    same_final_parameters(cluster, ns, (JOB, REFERENCE), steps)
    assert _tier(cluster, ns) == "local (peer copy)"
