"""Controller worker semantics with a FakeClock: requeue on error with backoff, requeue_after,
forget on success, one worker per request. Time never passes unless the test steps it."""

from __future__ import annotations

import asyncio
from collections import Counter

from reconciler.clock import FakeClock
from reconciler.controller import Controller, Request, Result, generation_changed, owner_of
from reconciler.metrics import Metrics


async def settle() -> None:
    """Let every ready task run (no time passes)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_errors_are_retried_with_per_request_backoff_then_forgotten() -> None:
    clock = FakeClock()
    calls: list[float] = []

    async def reconcile(req: Request) -> Result | None:
        calls.append(clock.now())
        if len(calls) <= 3:
            raise RuntimeError("not yet")
        return None

    metrics = Metrics()
    ctrl = Controller("c", reconcile, clock=clock, metrics=metrics)
    run = asyncio.create_task(ctrl.run())
    await settle()
    ctrl.enqueue(Request("ns", "a"))
    await settle()
    assert calls == [0.0]
    for expected in (0.005, 0.015, 0.035):  # 5 ms, then 10, then 20 after each failure
        clock.step(0.005 if expected == 0.005 else expected - clock.now())
        await settle()
        assert calls[-1] == expected
    assert len(calls) == 4
    assert ctrl.queue is not None and ctrl.queue.num_requeues(Request("ns", "a")) == 0
    assert metrics.value("controller_reconcile_errors_total", {"controller": "c"}) == 3
    assert (
        metrics.value("controller_reconcile_total", {"controller": "c", "result": "success"}) == 1
    )
    assert metrics.value("controller_reconcile_time_seconds_count", {"controller": "c"}) == 4
    await ctrl.stop()
    await run


async def test_requeue_after_reconciles_again_only_when_due() -> None:
    clock = FakeClock()
    seen: list[float] = []

    async def reconcile(req: Request) -> Result:
        seen.append(clock.now())
        return Result(requeue_after=30)

    ctrl = Controller("c", reconcile, clock=clock)
    run = asyncio.create_task(ctrl.run())
    await settle()
    ctrl.enqueue(Request("", "cluster-scoped"))
    await settle()
    clock.step(29.9)
    await settle()
    assert seen == [0.0]
    clock.step(0.1)
    await settle()
    assert seen == [0.0, 30.0]
    await ctrl.stop()
    await run


async def test_one_worker_per_request_and_repeats_collapse() -> None:
    clock = FakeClock()
    active: Counter[Request] = Counter()
    peak: Counter[Request] = Counter()
    done: Counter[Request] = Counter()
    gate = asyncio.Event()

    async def reconcile(req: Request) -> None:
        active[req] += 1
        peak[req] = max(peak[req], active[req])
        await gate.wait()
        active[req] -= 1
        done[req] += 1

    ctrl = Controller("c", reconcile, workers=4, clock=clock)
    run = asyncio.create_task(ctrl.run())
    await settle()
    reqs = [Request("ns", f"o{i}") for i in range(3)]
    for _ in range(10):
        for r in reqs:
            ctrl.enqueue(r)
    await settle()
    assert sum(active.values()) == 3, "three distinct requests in flight, on three workers"
    for _ in range(10):
        for r in reqs:
            ctrl.enqueue(r)  # added while in flight: reconciled once more afterwards
    gate.set()
    await settle()
    assert all(peak[r] == 1 for r in reqs)
    assert all(done[r] == 2 for r in reqs)
    await ctrl.stop()
    await run


async def test_stop_with_drain_finishes_queued_work() -> None:
    clock = FakeClock()
    finished: list[str] = []

    async def reconcile(req: Request) -> None:
        await asyncio.sleep(0)
        finished.append(req.name)

    ctrl = Controller("c", reconcile, workers=2, clock=clock)
    run = asyncio.create_task(ctrl.run())
    await settle()
    for i in range(10):
        ctrl.enqueue(Request("ns", str(i)))
    await ctrl.stop(drain_timeout=5)
    await run
    assert sorted(finished, key=int) == [str(i) for i in range(10)]
    assert not ctrl.running


def test_owner_mapping() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "ownerReferences": [
                {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "job"},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm"},
            ],
        }
    }
    assert owner_of("PyTorchJob")(pod) == [Request("ns", "job")]
    assert owner_of("PyTorchJob", "kubeflow.org")(pod) == [Request("ns", "job")]
    assert owner_of("PyTorchJob", "batch")(pod) == []
    assert Request.from_key("ns/x") == Request("ns", "x")
    assert Request.from_key("x") == Request("", "x")


def test_generation_changed_ignores_status_writes() -> None:
    old = {"metadata": {"generation": 1, "resourceVersion": "1"}, "status": {}}
    status_write = old | {
        "metadata": old["metadata"] | {"resourceVersion": "2"},
        "status": {"x": 1},
    }
    spec_edit = old | {"metadata": old["metadata"] | {"generation": 2}}
    deleting = old | {"metadata": old["metadata"] | {"deletionTimestamp": "2025-01-01T00:00:00Z"}}
    assert not generation_changed(old, status_write)
    assert not generation_changed(old, status_write, deletion=True)
    assert generation_changed(old, spec_edit)
    assert generation_changed(old, spec_edit, deletion=True)
    assert not generation_changed(old, deleting)
    assert generation_changed(old, deleting, deletion=True)
    assert generation_changed({}, {"metadata": {"generation": 1}})
