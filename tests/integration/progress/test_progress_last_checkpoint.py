"""The last-checkpoint annotations on the real control plane: a PyTorchJob (an injected master
and an uninjected worker) on KWOK, the master's progress file rewritten by the test; every pod of
the job carries the latest complete checkpoint, follows a newer one, is not written again when
nothing changed, and a recreated pod gets them too."""

from __future__ import annotations

import copy
import time
from datetime import UTC, datetime, timedelta, timezone

from progress_support import (
    eventually,
    get_tp,
    progress,
    pytorchjob,
    running_controller,
    write_atomic,
)

from localcluster import LocalCluster
from reconciler.client import Client
from reconciler.resources import PODS
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION as STEP,
)
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_TIME_ANNOTATION as TIME,
)

WITHIN = 10.0  # a 1 s poll, exec and watch latency on a busy 2-core machine
JOB = "lastck"
PODS_OF_JOB = {f"{JOB}-master-0", f"{JOB}-worker-0"}


def checkpoint(step: int, when: str) -> dict:
    return {
        "enabled": True,
        "latestCheckpoint": f"/ckpt/{JOB}/checkpoint-{step}",
        "checkpointsCreated": 1,
        "latestCheckpointTime": when,
    }


async def job_pods(client: Client, ns: str) -> dict[str, dict]:
    """The job's pods by name, not being deleted."""
    out = await client.api(PODS).list(ns, label_selector=f"training.kubeflow.org/job-name={JOB}")
    return {
        p["metadata"]["name"]: p for p in out["items"] if not p["metadata"].get("deletionTimestamp")
    }


def utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ours(pod: dict) -> dict[str, str]:
    annotations = pod["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k in (TIME, STEP)}


async def all_carry(client: Client, ns: str, want: dict[str, str]) -> dict[str, dict] | None:
    pods = await job_pods(client, ns)
    ok = set(pods) == PODS_OF_JOB and all(ours(p) == want for p in pods.values())
    return pods if ok else None


async def step_is(client: Client, ns: str, step: int) -> bool:
    tp = await get_tp(client, ns, JOB)
    return bool(tp) and (tp.get("status") or {}).get("step") == step


async def test_every_pod_carries_the_latest_checkpoint_and_is_written_only_on_change(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    path = kwok.exec_dir(ns, f"{JOB}-master-0") / "progress.json"
    write_atomic(path, progress(1))
    job = pytorchjob(JOB, ns, str(path), workers=1)
    # The worker as the webhook would leave it when it was down: not injected, still the job's.
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    worker["template"] = copy.deepcopy(worker["template"])
    worker["template"]["metadata"]["labels"] = {"team": "a"}
    kwok.apply(job)
    # Checkpoint times the controller believes: after the job was created, not in the future.
    saved = datetime.now(UTC).replace(microsecond=0)
    plus_one = saved.astimezone(timezone(timedelta(hours=1))).isoformat()  # "...+01:00"
    later = saved + timedelta(seconds=30)
    async with running_controller(client) as ctrl:
        # No checkpoint yet: nothing on the pods.
        await eventually(lambda: step_is(client, ns, 1), "the first record", 90)
        pods = await eventually(lambda: _both(client, ns), "both pods of the job", 60)
        assert all(ours(p) == {} for p in pods.values()), pods
        assert ctrl.stats["annotation_writes"] == 0

        # A checkpoint: every pod carries it, the time in UTC whatever offset the file used.
        write_atomic(path, progress(5, checkpointing=checkpoint(5, plus_one)))
        first = {TIME: utc(saved), STEP: "5"}
        pods = await eventually(lambda: all_carry(client, ns, first), "the annotations", WITHIN)
        assert pods[f"{JOB}-worker-0"]["metadata"]["labels"]["team"] == "a"  # the rest stays
        managers = {
            m["manager"]
            for m in pods[f"{JOB}-master-0"]["metadata"].get("managedFields") or []
            if "f:annotations" in (m.get("fieldsV1") or {}).get("f:metadata", {})
        }
        assert "kubeckpt-last-checkpoint" in managers, managers

        # Steps go on, the checkpoint stays: polls write nothing to the pods. The counter is what
        # shows it: a patch that changes nothing leaves the resourceVersion as it is too.
        rvs = {n: p["metadata"]["resourceVersion"] for n, p in pods.items()}
        writes, reads = ctrl.stats["annotation_writes"], ctrl.stats["reads"]
        assert writes == 2, ctrl.stats
        write_atomic(path, progress(6, checkpointing=checkpoint(5, plus_one)))
        await eventually(lambda: step_is(client, ns, 6), "step 6", WITHIN)
        await eventually(lambda: ctrl.stats["reads"] >= reads + 4, "more reads", WITHIN * 2)
        pods = await job_pods(client, ns)
        assert {n: p["metadata"]["resourceVersion"] for n, p in pods.items()} == rvs
        assert ctrl.stats["annotation_writes"] == writes

        # A newer checkpoint: every pod follows.
        write_atomic(path, progress(8, checkpointing=checkpoint(8, utc(later))))
        second = {TIME: utc(later), STEP: "8"}
        await eventually(lambda: all_carry(client, ns, second), "the newer checkpoint", WITHIN)

        # A restarted rank: the operator recreates the worker (same name, new uid), bare; it
        # gets the annotations at the next reconcile, without a new checkpoint.
        old_uid = pods[f"{JOB}-worker-0"]["metadata"]["uid"]
        t0 = time.monotonic()
        kwok.kubectl("delete", "pod", f"{JOB}-worker-0", "-n", ns, "--wait=false")

        async def recreated() -> dict | None:
            pods = await all_carry(client, ns, second)
            new = (pods or {}).get(f"{JOB}-worker-0")
            return new if new and new["metadata"]["uid"] != old_uid else None

        await eventually(recreated, "the recreated worker annotated", 60)
        assert time.monotonic() - t0 < 60
        tp = await get_tp(client, ns, JOB)
        ck = tp["status"]["checkpointing"]  # the TrainingProgress says the same
        assert ck["latestCheckpointTime"] == second[TIME]
        assert ck["latestCheckpoint"].endswith(f"checkpoint-{second[STEP]}")


async def _both(client: Client, ns: str) -> dict[str, dict] | None:
    pods = await job_pods(client, ns)
    return pods if set(pods) == PODS_OF_JOB else None
