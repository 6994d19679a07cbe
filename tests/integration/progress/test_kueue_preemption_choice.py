"""The cost signal's claim with the real Kueue, cheaply (issue 25 item 5; the figure is
hack/bench/kueue_preemption_bench.py and preemption_sim.py): two low-priority jobs fill a
ClusterQueue, one checkpointed long ago and admitted last, one that just checkpointed and was
admitted first; a high-priority job arrives. Without boosts Kueue's own order evicts the most
recently admitted (the one that loses most); with the writer on it evicts the one that just
checkpointed."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.kueue_preemption_bench import job, queues
from progress_support import FAST, progress, write_atomic

from localcluster import LocalCluster
from progress_controller.controller import ProgressController
from progress_controller.preemption_cost import PRIORITY_BOOST_ANNOTATION
from progress_controller.preemption_cost_controller import PreemptionCostController
from progress_controller.workload_boost import WORKLOAD_API_VERSION, workload_job
from reconciler.client import Client
from reconciler.manager import Manager
from tests.support.cluster_clients import eventually

STEP_SECONDS = 10


def _record(step: int, checkpoint_step: int) -> bytes:
    when = datetime.now(UTC) - timedelta(seconds=5)
    return progress(
        step,
        totalSteps=100000,
        stepSeconds=str(STEP_SECONDS),
        checkpointing={
            "enabled": True,
            "latestCheckpoint": f"/ckpt/checkpoint-{checkpoint_step}",
            "checkpointsCreated": 1,
            "latestCheckpointTime": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastSaveSeconds": "20",
        },
    )


async def _workloads(client: Client, ns: str) -> dict[str, dict[str, Any]]:
    api = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    return {
        owner.name: wl
        for wl in (await api.list_all(ns)).items
        if (owner := workload_job(wl)) is not None
    }


def _true(wl: dict[str, Any], type_: str, reason: str | None = None) -> bool:
    return any(
        c.get("type") == type_
        and c.get("status") == "True"
        and (reason is None or c.get("reason") == reason)
        for c in (wl.get("status") or {}).get("conditions") or []
    )


async def _fill_and_preempt(
    kueue: LocalCluster, client: Client, ns: str, *, signal: bool
) -> tuple[str, dict[str, dict[str, Any]]]:
    """The two low jobs, admitted in order (just-saved first, a second apart: Kueue compares
    admission times in whole seconds), the controller (and with `signal` the boost writer),
    then the high job; the name of the job Kueue evicted and the Workloads just before."""
    kueue.apply(queues(ns, 2))
    manager = Manager(client, name=f"choice-{ns}", port=None, drain_timeout=1.0)
    progress_ctrl = ProgressController(manager, settings=FAST)
    if signal:
        PreemptionCostController(manager, progress_ctrl)
    task = asyncio.create_task(manager.run())
    try:
        # just-saved: 5 steps (50 s) at risk; saved-long-ago: 900 steps (9000 s).
        for name, (step, ckpt) in (("just-saved", (1000, 995)), ("saved-long-ago", (1000, 100))):
            path = kueue.exec_dir(ns, f"{name}-master-0") / "progress.json"
            write_atomic(path, _record(step, ckpt))
            kueue.apply(job(name, ns, "low", str(path)))

            async def admitted(name: str = name) -> bool:
                wl = (await _workloads(client, ns)).get(name)
                return wl is not None and _true(wl, "Admitted")

            await eventually(admitted, f"Kueue to admit {name}", within=60, interval=0.3)
            time.sleep(1.1)  # noqa: ASYNC251 - the next admission in a later second

        async def ready() -> dict[str, dict[str, Any]] | None:
            wls = await _workloads(client, ns)
            boosts = [
                (wl["metadata"].get("annotations") or {}).get(PRIORITY_BOOST_ANNOTATION)
                for wl in wls.values()
            ]
            return wls if all(boosts) == signal and len(wls) == 2 else None

        what = "both boosts written" if signal else "both Workloads"
        before = await eventually(ready, what, within=90, interval=0.5)
        kueue.apply(job("high", ns, "high", None))

        async def evicted() -> str | None:
            for name, wl in (await _workloads(client, ns)).items():
                if _true(wl, "Evicted", "Preempted"):
                    return name
            return None

        victim = await eventually(evicted, "Kueue to evict a low job", within=60, interval=0.3)
        return victim, before
    finally:
        manager.stop()
        await asyncio.wait_for(task, 30)
        kueue.kubectl("delete", "clusterqueue", f"cq-{ns}", "--wait=false", check=False)


async def test_without_the_signal_kueue_evicts_the_most_recently_admitted(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    victim, before = await _fill_and_preempt(kueue, client, namespace, signal=False)
    assert victim == "saved-long-ago"  # 900 steps lost: Kueue alone cannot know
    assert all(PRIORITY_BOOST_ANNOTATION not in (wl["metadata"].get("annotations") or {})
               for wl in before.values())  # fmt: skip


async def test_with_the_signal_kueue_evicts_the_job_that_just_checkpointed(
    kueue: LocalCluster, client: Client, namespace: str
) -> None:
    victim, before = await _fill_and_preempt(kueue, client, namespace, signal=True)
    boosts = {
        name: int(wl["metadata"]["annotations"][PRIORITY_BOOST_ANNOTATION])
        for name, wl in before.items()
    }
    assert boosts["just-saved"] < boosts["saved-long-ago"]
    assert victim == "just-saved"  # 5 steps lost instead of 900
