"""A job whose just-in-time save fails (issue 25): its last record says the stop could not save
(failedSaves, lastError, lastFailedStep); the controller says so with one CheckpointFailed
Warning on the job and on its TrainingProgress, naming the checkpoint the next resume comes from;
the replacement resumes from the older periodic checkpoint, and the Resumed Event and the
TrainingProgress's lifetime count the steps that cost. On the real control plane (KWOK pods)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from progress_support import (
    event_counts,
    eventually,
    get_tp,
    job_events,
    progress,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from reconciler.client import Client

PERIODIC = {"checkpointsCreated": 4, "latestCheckpoint": "/ckpt/checkpoint-40"}
STOP_FAILED = {
    **PERIODIC,
    "failedSaves": 1,
    "lastError": "just-in-time save failed: [Errno 28] No space left on device",
    "lastFailedStep": 47,
}


def record(step: int, incarnation: str, ck: dict[str, Any], resumed: str | None = None) -> bytes:
    extra: dict[str, Any] = {"incarnation": incarnation, "checkpointing": {"enabled": True, **ck}}
    if resumed:
        extra["resumedFrom"] = resumed
    return progress(step, **extra)


def master_uid(cluster: LocalCluster, ns: str, job: str) -> str | None:
    p = cluster.kubectl("get", "pod", f"{job}-master-0", "-n", ns, "-o", "json", check=False)
    return json.loads(p.stdout)["metadata"]["uid"] if p.returncode == 0 else None


async def test_a_failed_jit_save_is_said_and_the_resume_counts_its_cost(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns, job = namespace, "stopfail"

    async def status_at(step: int) -> dict | None:
        st = ((await get_tp(client, ns, job)) or {}).get("status") or {}
        return st if st.get("step") == step else None

    path: Path = start_job(kwok, ns, job, record(45, "a", PERIODIC))
    async with running_controller(client):
        await eventually(lambda: status_at(45), "the first record", 90)
        write_atomic(path, record(47, "a", STOP_FAILED))  # the stop's save failed at 47
        st = await eventually(lambda: status_at(47), "the failed stop's record", 60)
        assert st["checkpointing"]["lastError"].endswith("No space left on device"), st

        async def warned() -> list[dict]:
            return [
                e
                for e in job_events(kwok, ns, job, "TrainingProgress")
                if e["reason"] == "CheckpointFailed"
            ]

        (warning,) = await eventually(warned, "the CheckpointFailed Event", 30)
        assert warning["type"] == "Warning"
        assert "at step 47" in warning["message"], warning
        assert "a resume comes from /ckpt/checkpoint-40" in warning["message"], warning

        old = master_uid(kwok, ns, job)
        kwok.kubectl("delete", "pod", f"{job}-master-0", "-n", ns, "--wait=false")
        await eventually(lambda: master_uid(kwok, ns, job) not in (None, old), "a new pod", 60)
        write_atomic(path, record(40, "b", {"checkpointsCreated": 0}, "/ckpt/checkpoint-40"))
        st = await eventually(lambda: status_at(40), "the resumed record", 60)

    last = st["lifetime"]["lastInterruption"]
    assert (last["lastStep"], last["resumedStep"], last["stepsLost"]) == (47, 40, 7), last
    resumed = [e for e in job_events(kwok, ns, job, "TrainingProgress") if e["reason"] == "Resumed"]
    assert resumed and "7 steps lost" in resumed[0]["message"], resumed
    for kind in ("PyTorchJob", "TrainingProgress"):
        counts = event_counts(kwok, ns, job, kind)
        assert counts.get("CheckpointFailed") == 1 and counts.get("Resumed") == 1, (kind, counts)
    described = kwok.kubectl("describe", "tp", job, "-n", ns).stdout
    assert "CheckpointFailed" in described and "7 steps lost" in described, described
