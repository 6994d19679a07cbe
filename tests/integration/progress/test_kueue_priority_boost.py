"""The priority-boost writer with the real Kueue (built from its module, localcluster/kueue.py):
Kueue makes the Workload of a queued PyTorchJob, the writer finds it by its controller
ownerReference, sets the boost by an unforced server-side apply that Kueue's own Workload webhook
(PriorityBoost gate on) accepts, and stops when a second field manager owns the annotation. End to
end: Kueue admits a job, the progress controller reads its record, and the writer keeps the
boost current as the job's work at risk grows and falls with a new checkpoint."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from progress_support import FAST, progress, pytorchjob, write_atomic

from localcluster import LocalCluster
from localcluster.kueue import queue_objects
from progress_controller.controller import ProgressController
from progress_controller.preemption_cost import PRIORITY_BOOST_ANNOTATION, boost_for_cost
from progress_controller.preemption_cost_controller import PreemptionCostController
from progress_controller.workload_boost import (
    FIELD_MANAGER,
    WORKLOAD_API_VERSION,
    annotation_managers,
    applied_configuration,
    decide,
    workload_job,
)
from reconciler.apply import apply
from reconciler.client import Client
from reconciler.errors import ApiError, Conflict
from reconciler.manager import Manager
from tests.support.cluster_clients import eventually

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


async def _queued_job_workload(client: Client, namespace: str) -> tuple[dict, dict]:
    """A PyTorchJob in a LocalQueue, and the Workload Kueue makes for it."""
    jobs = await client.api_for("kubeflow.org/v1", "PyTorchJob")
    body = pytorchjob("train", namespace, "/tmp/progress.json")
    body["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    job = await jobs.create(body)
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    found: list[dict[str, Any]] = []

    async def made() -> bool:
        items = (await workloads.list_all(namespace)).items
        found[:] = [
            w for w in items if (wj := workload_job(w)) and wj.uid == job["metadata"]["uid"]
        ]
        return bool(found)

    await eventually(made, "Kueue to make the job's Workload", within=60, interval=0.5)
    return job, found[0]


async def test_kueue_suspends_the_queued_job_and_names_it_on_its_workload(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    job, wl = await _queued_job_workload(client, namespace)
    owner = workload_job(wl)
    assert owner is not None and owner.kind.kind == "PyTorchJob" and owner.name == "train"
    assert wl["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == job["metadata"]["uid"]
    jobs = await client.api_for("kubeflow.org/v1", "PyTorchJob")
    fresh = await jobs.get("train", namespace)
    assert fresh["spec"]["runPolicy"]["suspend"] is True  # Kueue's webhook: queued, not admitted


async def test_the_writer_sets_the_boost_that_kueue_accepts(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    _, wl = await _queued_job_workload(client, namespace)
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    decision = decide(wl, 56, now=datetime.now(UTC))
    assert decision.write and decision.value == "56"
    written = await apply(
        workloads, applied_configuration(wl, "56"), field_manager=FIELD_MANAGER, force=False
    )
    assert written["metadata"]["annotations"][PRIORITY_BOOST_ANNOTATION] == "56"
    assert set(annotation_managers(written)) == {FIELD_MANAGER}
    assert written["spec"] == (await workloads.get(wl["metadata"]["name"], namespace))["spec"]
    # Kueue's Workload webhook validates the annotation (the gate is on): not an int32, refused.
    with pytest.raises(ApiError) as e:
        await apply(
            workloads,
            applied_configuration(wl, "99999999999"),
            field_manager=FIELD_MANAGER,
            force=False,
        )
    assert "priority-boost" in str(e.value)


async def test_the_writer_leaves_a_boost_another_manager_owns(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    _, wl = await _queued_job_workload(client, namespace)
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    name = wl["metadata"]["name"]
    await apply(workloads, applied_configuration(wl, "40"), field_manager=FIELD_MANAGER)
    theirs = await workloads.patch(
        name,
        {"metadata": {"annotations": {PRIORITY_BOOST_ANNOTATION: "500"}}},
        namespace,
        patch_type="merge",
        field_manager="platform-admin",
    )
    decision = decide(theirs, 0, now=datetime.now(UTC))
    assert decision.action == "foreign" and decision.owners == ("platform-admin",)
    with pytest.raises(Conflict):
        await apply(workloads, applied_configuration(theirs, "0"), field_manager=FIELD_MANAGER)
    assert (await workloads.get(name, namespace))["metadata"]["annotations"][
        PRIORITY_BOOST_ANNOTATION
    ] == "500"


def _record(step: int, checkpoint_step: int, when: datetime) -> bytes:
    return progress(
        step,
        stepSeconds="2",
        checkpointing={
            "enabled": True,
            "latestCheckpoint": f"/ckpt/train/checkpoint-{checkpoint_step}",
            "checkpointsCreated": 1,
            "latestCheckpointTime": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastSaveSeconds": "20",
        },
    )


async def test_the_controller_keeps_an_admitted_jobs_boost_current(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    kueue.apply(queue_objects(namespace))
    path = kueue.exec_dir(namespace, "train-master-0") / "progress.json"
    write_atomic(path, _record(500, 100, datetime.now(UTC)))
    job = pytorchjob("train", namespace, str(path))
    job["metadata"]["labels"] = {QUEUE_LABEL: "lq"}
    kueue.apply(job)
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")

    async def boost_is(value: str) -> dict | None:
        for wl in (await workloads.list_all(namespace)).items:
            annotations = wl["metadata"].get("annotations") or {}
            if workload_job(wl) and annotations.get(PRIORITY_BOOST_ANNOTATION) == value:
                return wl
        return None

    manager = Manager(client, name="preemption-cost-test", port=None, drain_timeout=1.0)
    progress_ctrl = ProgressController(manager, settings=FAST, workload_interval=1.0)
    cost = PreemptionCostController(
        manager,
        progress_ctrl,
    )
    task = asyncio.create_task(manager.run())
    try:
        # Admitted by Kueue, read by the progress controller: 400 steps of 2 s and a 20 s save
        # at risk.
        high = str(boost_for_cost(400 * 2 + 20))
        wl = await eventually(lambda: boost_is(high), f"the boost {high}", within=90)
        assert int(high) > 0
        # No writer but us (a Kueue status write from a cache behind ours can take our entry's
        # ownership of the value we wrote: test_kueue_preemption.py).
        assert set(annotation_managers(wl)) <= {FIELD_MANAGER}
        # Before it: at most the neutral 0 while the shared Workload informer saw the job Pending.
        # The write shows on the server before the controller's coroutine counts it (the test
        # polls in the same event loop): wait for the count.
        await eventually(lambda: cost.stats["writes"] >= 1, "the high write counted", within=10)
        before = cost.stats["writes"]
        assert before <= 2, cost.stats
        # A new checkpoint at step 500: 10 steps and the save at risk, written at once.
        write_atomic(path, _record(510, 500, datetime.now(UTC)))
        low = str(boost_for_cost(10 * 2 + 20))
        await eventually(lambda: boost_is(low), f"the boost to fall to {low}", within=30)
        assert int(low) < int(high)
        # Counted after the server shows it, as above (the full run of stop 37 saw 1 against 1+1).
        await eventually(
            lambda: cost.stats["writes"] >= before + 1, "the fall's write counted", within=10
        )
        # One write for the fall, none in between: no churn.
        assert cost.stats["writes"] == before + 1 and cost.stats["foreign"] == 0, cost.stats
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)
        kueue.kubectl("delete", "clusterqueue", f"cq-{namespace}", "--wait=false", check=False)
