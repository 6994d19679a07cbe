"""Counts over a job's life on the real control plane (issue 29): the counters across two
preemptions, with a controller restart between them, as the API server stores them (the CRD's
schema prunes any field it does not declare) and `kubectl describe tp` shows them."""

from __future__ import annotations

import json
import re
from typing import Any

from progress_support import (
    eventually,
    get_tp,
    progress,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from reconciler.client import Client


def record(step: int, incarnation: str, created: int, resumed: str | None = None) -> bytes:
    ck = {"enabled": True, "checkpointsCreated": created}
    if created:
        ck["latestCheckpoint"] = f"/ckpt/checkpoint-{step - step % 10}"
    extra: dict[str, Any] = {"incarnation": incarnation, "checkpointing": ck}
    if resumed:
        extra["resumedFrom"] = resumed
    return progress(step, **extra)


def master_uid(cluster: LocalCluster, ns: str, job: str) -> str | None:
    p = cluster.kubectl("get", "pod", f"{job}-master-0", "-n", ns, "-o", "json", check=False)
    return json.loads(p.stdout)["metadata"]["uid"] if p.returncode == 0 else None


async def preempt(cluster: LocalCluster, ns: str, job: str) -> None:
    """The master pod goes; the operator makes a new one (same name, new uid)."""
    old = master_uid(cluster, ns, job)
    cluster.kubectl("delete", "pod", f"{job}-master-0", "-n", ns, "--wait=false")
    await eventually(lambda: master_uid(cluster, ns, job) not in (None, old), "a new pod", 60)


async def test_the_counters_across_two_preemptions(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns, job = namespace, "twice"

    async def life(step: int) -> dict | None:
        st = ((await get_tp(client, ns, job)) or {}).get("status") or {}
        return st if st.get("step") == step and st.get("lifetime") else None

    path = start_job(kwok, ns, job, record(20, "a", 2))
    async with running_controller(client):
        await eventually(lambda: life(20), "process a's first record", 90)
        write_atomic(path, record(35, "a", 3))
        await eventually(lambda: life(35), "process a's last record", 30)
        await preempt(kwok, ns, job)
        # The new pod serves process a's record until process b writes: still one process.
        write_atomic(path, record(40, "b", 1, "checkpoint-30"))
        st = await eventually(lambda: life(40), "process b's first record", 60)
        assert st["lifetime"]["interruptions"] == 1, st

    # A new controller has only the stored status.
    async with running_controller(client) as ctrl:
        write_atomic(path, record(52, "b", 2, "checkpoint-30"))
        await eventually(lambda: life(52), "process b's last record", 60)
        await preempt(kwok, ns, job)
        write_atomic(path, record(50, "c", 0, "checkpoint-50"))
        st = await eventually(lambda: life(50), "process c's first record", 60)
        text = ctrl.manager.metrics.exposition().decode()

    lifetime = st["lifetime"]
    assert st["checkpointing"]["checkpointsCreated"] == 5, st  # 3 by a, 2 by b, 0 by c
    assert (lifetime["checkpointsCreated"], lifetime["incarnation"]) == (5, "c"), lifetime
    assert (lifetime["interruptions"], lifetime["resumes"]) == (2, 2), lifetime
    assert lifetime["stepsLost"] == (35 - 30) + (52 - 50), lifetime
    last = lifetime["lastInterruption"]
    assert (last["lastStep"], last["resumedStep"], last["stepsLost"]) == (52, 50, 2), last
    assert float(lifetime["secondsLost"]) >= float(last["secondsLost"]) >= 0, lifetime
    labels = f'job="{job}",namespace="{ns}"'
    assert f"kubeckpt_training_interruptions{{{labels}}} 2.0" in text, text
    assert f"kubeckpt_checkpoints_created{{{labels}}} 5.0" in text, text
    described = kwok.kubectl("describe", "tp", job, "-n", ns).stdout
    assert re.search(r"Checkpoints Created:\s+5\n", described), described
    assert re.search(r"Interruptions:\s+2\n", described), described
