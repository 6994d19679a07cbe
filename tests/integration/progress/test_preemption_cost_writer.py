"""The priority-boost writer against a real API server: its server-side apply owns the one
annotation and nothing else, a second field manager that owns the annotation stops it (the rule
in workload_boost.decide, and the API server's 409 behind it), and the admission policy
kubeckpt-reconciler-workloads refuses whatever else the reconciler's account might send.

The Workload CRD here is a stand-in with Kueue's group, version and kind, no schema and no
webhook (the real Kueue is not part of this local cluster yet): enough for what these tests
assert, which is about managedFields and admission, not about Kueue's scheduling.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from progress_support import pytorchjob

from localcluster import LocalCluster
from progress_controller.preemption_cost import PRIORITY_BOOST_ANNOTATION
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
from reconciler.errors import Conflict
from tests.support import policies as pol

STAND_IN_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "workloads.kueue.x-k8s.io"},
    "spec": {
        "group": "kueue.x-k8s.io",
        "names": {"kind": "Workload", "plural": "workloads", "singular": "workload"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1beta2",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
NOW = datetime.now(UTC)
# Valid under Kueue's own CRD too (test_kueue_priority_boost.py installs it in the same session).
SPEC = {
    "queueName": "lq",
    "podSets": [
        {
            "name": "master",
            "count": 1,
            "template": {"spec": {"containers": [{"name": "pytorch", "image": "busybox"}]}},
        }
    ],
}


@pytest.fixture(scope="module")
def workload_crd(cluster: LocalCluster) -> Iterator[None]:
    have = cluster.kubectl("get", "crd", "workloads.kueue.x-k8s.io", check=False)
    if have.returncode != 0:
        cluster.apply(STAND_IN_CRD)
        cluster.kubectl(
            "wait", "--for=condition=Established", "crd/workloads.kueue.x-k8s.io", "--timeout=60s"
        )
    yield
    if have.returncode != 0:
        cluster.kubectl("delete", "crd", "workloads.kueue.x-k8s.io", "--timeout=60s", check=False)


async def _workload(client: Client, namespace: str, name: str = "pytorchjob-train-1") -> dict:
    jobs = await client.api_for("kubeflow.org/v1", "PyTorchJob")
    job = await jobs.create(pytorchjob("train", namespace, "/tmp/progress.json"))
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    md = job["metadata"]
    return await workloads.create(
        {
            "apiVersion": WORKLOAD_API_VERSION,
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"kueue.x-k8s.io/job-uid": md["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": "kubeflow.org/v1",
                        "kind": "PyTorchJob",
                        "name": md["name"],
                        "uid": md["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": SPEC,
        },
        field_manager="kueue",
    )


async def _write(client: Client, wl: dict[str, Any], boost: int) -> dict[str, Any] | None:
    """What the controller shell does for one Workload: decide, then apply unforced."""
    decision = decide(wl, boost, now=NOW)
    if not decision.write:
        return None
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    body = applied_configuration(wl, decision.value or "")
    return await apply(workloads, body, field_manager=FIELD_MANAGER, force=False)


async def test_the_writer_owns_the_annotation_and_nothing_else(
    client: Client, namespace: str, workload_crd: None
) -> None:
    wl = await _workload(client, namespace)
    assert workload_job(wl) is not None
    written = await _write(client, wl, 40)
    assert written is not None
    assert written["metadata"]["annotations"] == {PRIORITY_BOOST_ANNOTATION: "40"}
    assert (
        written["spec"] == wl["spec"] and written["metadata"]["labels"] == wl["metadata"]["labels"]
    )
    assert set(annotation_managers(written)) == {FIELD_MANAGER}
    # Same value: nothing sent. A new checkpoint (0): written at once, still ours alone.
    assert await _write(client, written, 40) is None
    again = await _write(client, written, 0)
    assert again is not None and again["metadata"]["annotations"][PRIORITY_BOOST_ANNOTATION] == "0"
    assert set(annotation_managers(again)) == {FIELD_MANAGER}


async def test_a_second_field_manager_owning_the_annotation_stops_the_writer(
    client: Client, namespace: str, workload_crd: None
) -> None:
    wl = await _workload(client, namespace)
    ours = await _write(client, wl, 40)
    assert ours is not None
    # An admin sets the boost by hand (kubectl's merge patch: an Update by another manager).
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    theirs = await workloads.patch(
        wl["metadata"]["name"],
        {"metadata": {"annotations": {PRIORITY_BOOST_ANNOTATION: "1000"}}},
        namespace,
        patch_type="merge",
        field_manager="platform-admin",
    )
    assert "platform-admin" in annotation_managers(theirs)
    decision = decide(theirs, 0, now=NOW)
    assert decision.action == "foreign" and decision.owners == ("platform-admin",)
    assert await _write(client, theirs, 0) is None
    # Were the writer to try regardless, the API server refuses the unforced apply.
    with pytest.raises(Conflict) as e:
        await apply(
            workloads, applied_configuration(theirs, "0"), field_manager=FIELD_MANAGER, force=False
        )
    assert any("platform-admin" in message for _, message in e.value.field_conflicts)
    final = await workloads.get(wl["metadata"]["name"], namespace)
    assert final["metadata"]["annotations"][PRIORITY_BOOST_ANNOTATION] == "1000"


@pytest.fixture(scope="module")
def reconciler_policies(cluster: LocalCluster, workload_crd: None) -> Iterator[None]:
    docs = pol.policies(cluster)
    pol.install(cluster, docs)
    try:
        yield
    finally:
        pol.remove(cluster, docs)


def _as_reconciler(cluster: LocalCluster, namespace: str, name: str, body: dict, how: str):
    """A server-side dry run of a write in the reconciler's name (impersonated with the masters
    group, so that RBAC lets it by and only the admission policies decide): `how` is "apply" (a
    server-side apply of `body`, what the controller sends) or "merge" (a merge patch)."""
    who = [f"--as={pol.RECONCILER}", "--as-group=system:masters", "--dry-run=server"]
    if how == "apply":
        return cluster.kubectl(
            "apply",
            "--server-side",
            f"--field-manager={FIELD_MANAGER}",
            *who,
            "-f",
            "-",
            input=json.dumps(body),
            check=False,
        )
    return cluster.kubectl(
        "patch",
        "workloads.kueue.x-k8s.io",
        name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps(body),
        *who,
        check=False,
    )


async def test_the_policy_allows_only_the_boost_on_a_jobs_workload(
    cluster: LocalCluster, client: Client, namespace: str, reconciler_policies: None
) -> None:
    wl = await _workload(client, namespace)
    name = wl["metadata"]["name"]
    ok = _as_reconciler(cluster, namespace, name, applied_configuration(wl, "40"), "apply")
    assert ok.returncode == 0, ok.stderr
    refused = [
        {"metadata": {"annotations": {PRIORITY_BOOST_ANNOTATION: "-5"}}},
        {"metadata": {"annotations": {PRIORITY_BOOST_ANNOTATION: "40", "other": "x"}}},
        {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "vip"}}},
        {"spec": {"queueName": "vip"}},
    ]
    for patch in refused:
        proc = _as_reconciler(cluster, namespace, name, patch, "merge")
        assert pol.denied_by(proc, "kubeckpt-reconciler-workloads"), (patch, proc.stderr)
    # A Workload that no training job controls is not the reconciler's to touch.
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")
    other = await workloads.create(
        {
            "apiVersion": WORKLOAD_API_VERSION,
            "kind": "Workload",
            "metadata": {"name": "plain", "namespace": namespace},
            "spec": SPEC,
        }
    )
    proc = _as_reconciler(cluster, namespace, "plain", applied_configuration(other, "40"), "apply")
    assert pol.denied_by(proc, "kubeckpt-reconciler-workloads"), proc.stderr
