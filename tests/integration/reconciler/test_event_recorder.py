"""Events written to the real API server: a repeat bumps count and lastTimestamp on one Event
(PATCH, not a new Event); a different message is a new Event; cluster-scoped objects' Events go
to "default"."""

from __future__ import annotations

import asyncio

from reconciler.client import Client
from reconciler.events import EventRecorder
from reconciler.objects import parse_time
from reconciler.resources import CONFIGMAPS, EVENTS, NAMESPACES


async def events_about(client: Client, namespace: str, name: str) -> list[dict]:
    items = (
        await client.api(EVENTS).list(namespace, field_selector=f"involvedObject.name={name}")
    )["items"]
    return sorted(items, key=lambda e: e["metadata"]["creationTimestamp"])


async def test_repeats_are_aggregated_into_one_event(client: Client, namespace: str) -> None:
    obj = await client.api(CONFIGMAPS).create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "subject", "namespace": namespace},
        }
    )
    obj = {"apiVersion": "v1", "kind": "ConfigMap", **obj}
    rec = EventRecorder(client, "kubeckpt-tests", host="test-host")
    runner = asyncio.create_task(rec.run())
    try:
        rec.event(obj, "Normal", "Checkpointed", "saved step 10")
        await rec.flush()
        first = (await events_about(client, namespace, "subject"))[0]
        await asyncio.sleep(1.1)  # lastTimestamp has seconds precision
        for _ in range(2):
            rec.event(obj, "Normal", "Checkpointed", "saved step 10")
        rec.event(obj, "Warning", "Stalled", "no progress for 5m")
        await rec.flush()
    finally:
        runner.cancel()
    events = await events_about(client, namespace, "subject")
    assert [(e["reason"], e["count"]) for e in events] == [("Checkpointed", 3), ("Stalled", 1)]
    agg = events[0]
    assert agg["metadata"]["name"] == first["metadata"]["name"]
    assert parse_time(agg["lastTimestamp"]) > parse_time(agg["firstTimestamp"])
    assert agg["involvedObject"]["uid"] == obj["metadata"]["uid"]
    assert agg["involvedObject"]["kind"] == "ConfigMap"
    assert agg["source"] == {"component": "kubeckpt-tests", "host": "test-host"}
    assert events[1]["type"] == "Warning"
    assert rec.stats["sent"] == 2 and rec.stats["aggregated"] == 2


async def test_events_on_cluster_scoped_objects_go_to_default(
    client: Client, namespace: str
) -> None:
    ns = await client.api(NAMESPACES).get(namespace)
    ns = {"apiVersion": "v1", "kind": "Namespace", **ns}
    rec = EventRecorder(client, "kubeckpt-tests")
    runner = asyncio.create_task(rec.run())
    try:
        assert rec.event(ns, "Normal", "Seen", "hello")
        await rec.flush()
    finally:
        runner.cancel()
    events = await events_about(client, "default", namespace)
    assert [e["reason"] for e in events] == ["Seen"]
