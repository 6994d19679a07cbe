"""A manager end to end on the real API server: a leader-elected controller reconciles ConfigMaps
(errors requeued with backoff), emits Events, serves /healthz, /readyz and /metrics, and releases
its Lease on an orderly stop."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
from conftest import eventually

from reconciler import (
    Client,
    LeaderElectionConfig,
    Manager,
    Request,
    Result,
)
from reconciler.resources import CONFIGMAPS, LEASES


async def test_manager_runs_a_leader_elected_controller_and_serves_probes(
    client: Client, namespace: str
) -> None:
    mgr = Manager(
        client,
        name="test",
        host="127.0.0.1",
        port=0,
        leader_election=LeaderElectionConfig("mgr-test", namespace, identity="solo"),
    )
    cms = client.api(CONFIGMAPS)
    informer = mgr.informer(cms, namespace=namespace, label_selector="app=mirror")
    recorder = mgr.event_recorder("mirror-controller")
    reconciled: Counter[str] = Counter()

    async def reconcile(req: Request) -> Result | None:
        obj = informer.store.get(req.key)
        if obj is None:
            return None  # deleted
        reconciled[req.name] += 1
        if req.name == "flaky" and reconciled[req.name] <= 2:
            raise RuntimeError("transient")
        recorder.event({"apiVersion": "v1", "kind": "ConfigMap", **obj}, "Normal", "Mirrored", "ok")
        return None

    ctrl = mgr.controller("mirror", reconcile, workers=2)
    ctrl.watch(informer)
    for name in ("one", "two", "flaky"):
        await cms.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": {"app": "mirror"}},
            }
        )
    running = asyncio.create_task(mgr.run())
    try:
        await eventually(lambda: mgr.bound_port is not None, "the probe server", within=10)
        base = f"http://127.0.0.1:{mgr.bound_port}"
        async with aiohttp.ClientSession() as http:

            async def status(path: str) -> int:
                async with http.get(base + path) as r:
                    return r.status

            async def ready() -> bool:
                return await status("/readyz") == 200

            assert await status("/healthz") == 200
            await eventually(ready, "readiness", within=30)
            await eventually(
                lambda: reconciled == {"one": 1, "two": 1, "flaky": 3}, "reconciles", within=30
            )
            assert mgr.is_leader
            await eventually(lambda: recorder.stats["sent"] == 3, "events", within=10)
            async with http.get(base + "/metrics") as r:
                text = await r.text()
        lease = (await client.api(LEASES).get("mgr-test", namespace))["spec"]
        assert lease["holderIdentity"] == "solo"
    finally:
        mgr.stop()
        await asyncio.wait_for(running, 30)

    def sample(line_start: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith(line_start))
        return float(line.rsplit(" ", 1)[1])

    assert sample('workqueue_depth{name="mirror"}') == 0
    assert sample('workqueue_adds_total{name="mirror"}') >= 5
    assert sample('workqueue_retries_total{name="mirror"}') == 2
    assert sample('controller_reconcile_errors_total{controller="mirror"}') == 2
    assert sample('controller_reconcile_time_seconds_count{controller="mirror"}') == 5
    assert sample('controller_reconcile_total{controller="mirror",result="success"}') == 3
    informer_label = f'informer="configmaps/{namespace}"'
    assert sample(f"informer_watch_restarts_total{{{informer_label}}}") == 0
    assert sample(f"informer_relists_total{{{informer_label}}}") == 0
    assert sample(f"informer_synced{{{informer_label}}}") == 1
    assert sample('leader_election_master_status{name="mgr-test"}') == 1
    assert sample('event_recorder_events_total{component="mirror-controller",outcome="sent"}') == 3
    assert sample('rest_client_requests_total{code="200",method="GET"}') > 0

    # Released on the orderly stop, as client-go's ReleaseOnCancel does.
    released = (await client.api(LEASES).get("mgr-test", namespace))["spec"]
    assert released["holderIdentity"] == ""
    assert released["leaseDurationSeconds"] == 1
    assert released["leaseTransitions"] == 0
