"""Stalled and NotInjected on the real control plane: each a condition, and one Event."""

from __future__ import annotations

import dataclasses
import json

from progress_support import (
    FAST,
    cond,
    eventually,
    get_tp,
    job_events,
    progress,
    pytorchjob,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from reconciler.client import Client


def reasons(cluster: LocalCluster, ns: str, job: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in job_events(cluster, ns, job):
        out[e["reason"]] = out.get(e["reason"], 0) + int(e.get("count") or 1)
    return out


async def condition_is(client: Client, ns: str, name: str, type_: str, status: str) -> dict:
    tp = await get_tp(client, ns, name)
    return tp if tp and cond(tp, type_).get("status") == status else None  # type: ignore[return-value]


async def test_stalled_warning_once_and_cleared(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    path = start_job(kwok, ns, "slow", progress(5))
    settings = dataclasses.replace(FAST, stall_floor=3.0)
    async with running_controller(client, settings) as _:
        await eventually(lambda: condition_is(client, ns, "slow", "Stalled", "False"), "ok", 90)
        tp = await eventually(
            lambda: condition_is(client, ns, "slow", "Stalled", "True"), "Stalled", 15
        )
        c = cond(tp, "Stalled")
        assert c["reason"] == "NoStepAdvance" and "step 5" in c["message"]
        await eventually(lambda: reasons(kwok, ns, "slow").get("Stalled") == 1, "event", 10)
        write_atomic(path, progress(6))
        await eventually(
            lambda: condition_is(client, ns, "slow", "Stalled", "False"), "cleared", 10
        )
    assert reasons(kwok, ns, "slow").get("Stalled") == 1


async def test_not_injected_pod_in_an_opted_in_namespace(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    """The webhook is not running here, as if it were down (it fails open): the operator's pods
    are created without the marker, in a namespace that opted in, with a matching policy."""
    ns = namespace
    kwok.kubectl("label", "namespace", ns, "kubeckpt.io/inject=enabled")
    kwok.apply(
        {
            "apiVersion": "kubeckpt.io/v1alpha1",
            "kind": "CheckpointPolicy",
            "metadata": {"name": "default", "namespace": ns},
            "spec": {"storage": {"uri": "file:///tmp/ckpt"}},
        }
    )
    job = pytorchjob("bare", ns, "/nonexistent", workers=1)
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        spec["template"]["metadata"]["labels"].pop("kubeckpt.io/injected", None)
    kwok.apply(job)
    # A job in a namespace that did not opt in is left alone.
    other = pytorchjob("quiet", ns, "/nonexistent")
    tmpl = other["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    tmpl["metadata"]["labels"] = {"kubeckpt.io/inject": "false"}
    kwok.apply(other)
    for run in range(2):  # the second run is a restarted controller: no second Event
        async with running_controller(client) as ctrl:
            tp = await eventually(
                lambda: condition_is(client, ns, "bare", "Injected", "False"), "Injected", 90
            )
            c = cond(tp, "Injected")
            assert c["reason"] == "PodsNotInjected"
            assert "bare-master-0" in c["message"] and "bare-worker-0" in c["message"]
            await eventually(
                lambda: reasons(kwok, ns, "bare").get("NotInjected") == 1, "one event", 10
            )
            if run == 1:
                await eventually(lambda: ctrl.stats["skipped_writes"] >= 1, "a reconcile", 10)
    assert reasons(kwok, ns, "bare")["NotInjected"] == 1
    assert await get_tp(client, ns, "quiet") is None
    events = json.loads(kwok.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    ours = [e for e in events if e.get("source", {}).get("component") == "kubeckpt-reconciler"]
    assert {e["involvedObject"]["name"] for e in ours} == {"bare"}
