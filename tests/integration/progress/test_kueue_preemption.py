"""Preemption by the real Kueue (built from its module, localcluster/kueue.py) on KWOK: a
ClusterQueue with room for one job, a low-priority PyTorchJob admitted and training, a
high-priority one submitted. Kueue evicts the low one; its TrainingProgress says Suspended,
evicted by Kueue, to admit the high one (by name), with one Evicted Event. And a Kueue restart in
the middle of that eviction: the low job is readmitted once the high one ends, its priority boost
is current again and ours alone, no Event is sent twice, and the TrainingProgress goes
Suspended -> Training.

KWOK pods run no training: the progress records are files the tests write, served by KWOK exec
as in the other progress tests (`exec_dir`); a job's pods are the training operator's.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from progress_support import (
    FAST,
    cond,
    eventually,
    get_tp,
    job_events,
    progress,
    pytorchjob,
    write_atomic,
)

from localcluster import LocalCluster
from localcluster.kueue import queue_objects
from progress_controller.controller import ProgressController
from progress_controller.preemption_cost import PRIORITY_BOOST_ANNOTATION, boost_for_cost
from progress_controller.preemption_cost_controller import PreemptionCostController
from progress_controller.workload_boost import (
    FIELD_MANAGER,
    WORKLOAD_API_VERSION,
    annotation_managers,
    workload_job,
)
from reconciler.client import Client
from reconciler.manager import Manager

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
COMPONENT = "kubeckpt-reconciler"


def _setup(cluster: LocalCluster, ns: str) -> None:
    """A ClusterQueue with room for one job (one CPU), which preempts by priority, its
    LocalQueue `lq`, and the two WorkloadPriorityClasses."""
    priorities = {f"{level}-{ns}": value for level, value in (("low", 100), ("high", 10_000))}
    cluster.apply(queue_objects(ns, cpu="1", priorities=priorities))


def _teardown(cluster: LocalCluster, ns: str) -> None:
    cluster.kubectl("delete", "clusterqueue", f"cq-{ns}", "--wait=false", check=False)
    for level in ("low", "high"):
        cluster.kubectl(
            "delete", "workloadpriorityclass", f"{level}-{ns}", "--wait=false", check=False
        )


def _job(cluster: LocalCluster, ns: str, name: str, level: str, record: bytes) -> None:
    """A one-pod PyTorchJob asking for the queue's one CPU, at priority `level`, whose master
    serves `record` as its progress file."""
    path = cluster.exec_dir(ns, f"{name}-master-0") / "progress.json"
    write_atomic(path, record)
    job = pytorchjob(name, ns, str(path))
    job["metadata"]["labels"] = {QUEUE_LABEL: "lq", PRIORITY_LABEL: f"{level}-{ns}"}
    template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    cluster.apply(job)


def _record(step: int, checkpoint_step: int, **kw: Any) -> bytes:
    return progress(
        step,
        stepSeconds="2",
        checkpointing={
            "enabled": True,
            "latestCheckpoint": f"/ckpt/low/checkpoint-{checkpoint_step}",
            "checkpointsCreated": 1,
            "latestCheckpointTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastSaveSeconds": "20",
        },
        **kw,
    )


def _ours(cluster: LocalCluster, ns: str, name: str, kind: str) -> dict[str, int]:
    """kubeckpt's Events on the object by reason (Kueue and the operator send their own)."""
    out: dict[str, int] = {}
    for e in job_events(cluster, ns, name, kind):
        if e.get("reportingComponent") == COMPONENT:
            out[e["reason"]] = out.get(e["reason"], 0) + int(e.get("count") or 1)
    return out


async def _status(client: Client, ns: str, name: str) -> dict[str, Any]:
    return ((await get_tp(client, ns, name)) or {}).get("status") or {}


async def _state(client: Client, ns: str, name: str, state: str, **want: Any) -> dict | None:
    st = await _status(client, ns, name)
    ok = st.get("state") == state and all(st.get(k) == v for k, v in want.items())
    return st if ok else None


async def _evicted_for_high(client: Client, ns: str) -> dict | None:
    st = await _status(client, ns, "low")
    msg = cond({"status": st}, "Progressing").get("message", "")
    if st.get("state") == "Suspended" and msg.startswith("evicted by Kueue at "):
        if f"to admit PyTorchJob {ns}/high (Workload " in msg:
            return st
    return None


async def _workload(client: Client, ns: str, job: str) -> dict | None:
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    for wl in (await workloads.list_all(ns)).items:
        owner = workload_job(wl)
        if owner is not None and owner.name == job:
            return wl
    return None


def _boost_owners(wl: dict | None) -> dict:
    """The Workload's boost and the managedFields entries that touch its annotations, for a
    failure message."""
    md = (wl or {}).get("metadata") or {}
    entries = [
        {k: e.get(k) for k in ("manager", "operation", "subresource", "time")}
        | {
            "annotations": sorted(
                ((e.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations") or {}
            )
        }
        for e in md.get("managedFields") or []
        if ((e.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:annotations")
    ]
    return {
        "boost": (md.get("annotations") or {}).get(PRIORITY_BOOST_ANNOTATION),
        "resourceVersion": md.get("resourceVersion"),
        "uid": md.get("uid"),
        "entries": entries,
    }


def _condition(wl: dict | None, type_: str) -> dict:
    conds = ((wl or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), {})


async def test_kueue_preemption_is_said_in_the_training_progress(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    _setup(kueue, ns)
    manager = Manager(client, name="eviction-test", port=None, drain_timeout=1.0)
    ProgressController(manager, settings=FAST, workload_interval=1.0)
    task = asyncio.create_task(manager.run())
    try:
        _job(kueue, ns, "low", "low", _record(40, 40))
        await eventually(lambda: _state(client, ns, "low", "Training", step=40), "low", 90)
        _job(kueue, ns, "high", "high", progress(1))
        st = await eventually(lambda: _evicted_for_high(client, ns), "evicted by Kueue", 90)
        msg = cond({"status": st}, "Progressing")["message"]
        assert "(Preempted: InClusterQueue)" in msg, msg
        assert msg.endswith(
            "; the job is suspended at step 40; it resumes from /ckpt/low/checkpoint-40 "
            "when unsuspended"
        ), msg
        wl = await _workload(client, ns, "low")
        assert _condition(wl, "Evicted")["status"] == "True", wl
        # The Event: once, on the job and on its TrainingProgress, with the status's words.
        await eventually(
            lambda: _ours(kueue, ns, "low", "PyTorchJob").get("Evicted") == 1, "the Event", 30
        )
        (event,) = [
            e
            for e in job_events(kueue, ns, "low", "PyTorchJob")
            if e["reason"] == "Evicted" and e.get("reportingComponent") == COMPONENT
        ]
        assert event["message"] == msg and event["type"] == "Normal"
        # The high job runs meanwhile; the low one's later polls send nothing again.
        await eventually(
            lambda: _state(client, ns, "high", "Training", step=1), "the high job to run", 90
        )
        await asyncio.sleep(5)
        assert _ours(kueue, ns, "low", "PyTorchJob").get("Evicted") == 1
        assert _ours(kueue, ns, "low", "TrainingProgress").get("Evicted") == 1
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)
        _teardown(kueue, ns)


def _succeed(cluster: LocalCluster, ns: str, pod: str) -> None:
    """What the kubelet reports when the training container exits 0 (KWOK keeps it Running)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cs = {
        "name": "pytorch",
        "image": "busybox",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "started": False,
        "state": {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": now,
                "finishedAt": now,
            }
        },
    }
    cluster.kubectl(
        "patch",
        "pod",
        pod,
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Succeeded", "containerStatuses": [cs]}}),
    )


async def test_a_kueue_restart_in_the_middle_of_an_eviction(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    _setup(kueue, ns)
    manager = Manager(client, name="eviction-restart-test", port=None, drain_timeout=1.0)
    ctrl = ProgressController(manager, settings=FAST, workload_interval=1.0)
    cost = PreemptionCostController(manager, ctrl)
    task = asyncio.create_task(manager.run())

    async def boost(value: str) -> dict | None:
        wl = await _workload(client, ns, "low")
        annotations = (wl or {}).get("metadata", {}).get("annotations") or {}
        return wl if annotations.get(PRIORITY_BOOST_ANNOTATION) == value else None

    try:
        # Training, 400 steps of 2 s and a 20 s save at risk: a boost that Kueue sees, far
        # below the gap between the two priority classes.
        _job(kueue, ns, "low", "low", _record(500, 100))
        running = str(boost_for_cost(400 * 2 + 20))
        await eventually(lambda: boost(running), f"the boost {running}", 90)
        _job(kueue, ns, "high", "high", progress(1))

        async def evicted() -> dict | None:
            wl = await _workload(client, ns, "low")
            return wl if _condition(wl, "Evicted").get("status") == "True" else None

        await eventually(evicted, "Kueue to evict the low job", 90, interval=0.2)
        # Kueue stops right after it evicted the job (before it is suspended, or right after)
        # and comes back before the low job is readmitted.
        kueue.kueue.restart()
        await eventually(lambda: _evicted_for_high(client, ns), "evicted by Kueue", 90)

        # Suspended: the neutral boost, and no writer but us. Kueue's eviction echoed the
        # annotation in its status write (a co-owner that cannot change it): written over, forced.
        # "Ours alone" is not asserted at 0: a status write that Kueue (restarted, its cache
        # behind) forces with the old value takes the annotation's ownership from our entry while
        # the API server keeps our value (a status write cannot change metadata; seen in CI, and
        # shown with a bare CRD). The value is right, so the writer has no reason to write again.
        seen: list[dict | None] = [None]

        async def zero_no_other_writer() -> dict | None:
            seen[0] = wl = await _workload(client, ns, "low")
            annotations = (wl or {}).get("metadata", {}).get("annotations") or {}
            if annotations.get(PRIORITY_BOOST_ANNOTATION) != "0":
                return None
            return wl if wl and set(annotation_managers(wl)) <= {FIELD_MANAGER} else None

        try:
            await eventually(zero_no_other_writer, "the boost to fall to 0, no writer but us", 60)
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen: {_boost_owners(seen[0])}; {cost.stats}") from e
        assert cost.stats["writes"] >= 2, cost.stats  # the running boost, then 0: both ours
        # The high job runs, then ends; Kueue readmits the low one, whose new master resumes.
        await eventually(
            lambda: _state(client, ns, "high", "Training", step=1), "the high job to run", 90
        )
        _succeed(kueue, ns, "high-master-0")

        async def readmitted() -> dict | None:
            wl = await _workload(client, ns, "low")
            admitted = _condition(wl, "QuotaReserved").get("status") == "True"
            return wl if admitted and _condition(wl, "Evicted").get("status") == "False" else None

        await eventually(readmitted, "the low job to be readmitted", 120)
        write_atomic(
            kueue.exec_dir(ns, "low-master-0") / "progress.json",
            _record(300, 100, resumedFrom="/ckpt/low/checkpoint-100"),
        )
        st = await eventually(
            lambda: _state(client, ns, "low", "Training", step=300), "low to train again", 90
        )
        assert cond({"status": st}, "Progressing")["reason"] == "Resumed", st
        # The boost is current again (200 steps of 2 s and the save at risk), written by us over
        # Kueue's echo (a later stale echo can take the entry's ownership, as above).
        current = str(boost_for_cost(200 * 2 + 20))
        wl = await eventually(lambda: boost(current), f"the boost {current}", 90)
        assert set(annotation_managers(wl)) <= {FIELD_MANAGER}, _boost_owners(wl)
        assert cost.stats["foreign"] == 0 and cost.stats["conflicts"] == 0
        # One eviction, one Event, on the job and on its TrainingProgress: neither Kueue's
        # restart nor the readmission sent it again.
        for kind in ("PyTorchJob", "TrainingProgress"):
            events = _ours(kueue, ns, "low", kind)
            assert events.get("Evicted") == 1 and events.get("Resumed") == 1, (kind, events)
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)
        _teardown(kueue, ns)
