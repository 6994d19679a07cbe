"""Injection by ownership: a pod is a job's training pod only if its controller ownerReference is
the object the job kind's operator creates pods with (a PyTorchJob for its pods, a batch/v1 Job of
the JobSet for a TrainJob's) and agrees with its labels. A bare pod that merely carries a job's
labels is admitted unchanged, with a warning and a `skipped` reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from kubeckpt_api.jobkinds import (
    JOB_KINDS,
    POD_CONTROLLERS,
    PYTORCHJOB,
    TRAINJOB,
    JobIdentity,
    ownership_problem,
)
from tests.support.operator_pods import batch_job_owner, operator_pod, pytorchjob_owner
from tests.unit.webhook.test_server import review
from webhook.mutation import OWNERSHIP_SKIPPED, mutate
from webhook.server import Metrics, make_app
from webhook.view import StaticView

NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}
POLICY = {
    "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {"storage": {"uri": "pvc://ckpt/runs"}},
}


def with_owners(pod: dict, owners: list[Any] | None) -> dict:
    p = copy.deepcopy(pod)
    if owners is None:
        del p["metadata"]["ownerReferences"]
    else:
        p["metadata"]["ownerReferences"] = owners
    return p


def test_every_kind_names_the_controller_of_its_pods() -> None:
    assert set(POD_CONTROLLERS) == {k.kind for k in JOB_KINDS}


def test_the_operators_pods_are_injected() -> None:
    for kind in ("PyTorchJob", "TrainJob"):
        r = mutate(operator_pod(kind, "llama", "team-a"), POLICY, NS)
        assert r.injected, (kind, r.reason)


def test_a_label_forged_master_is_admitted_unchanged_with_a_warning() -> None:
    """The issue's hostile case: a bare pod labelled as a PyTorchJob's master."""
    forged = with_owners(operator_pod("PyTorchJob", "llama", "team-a"), None)
    before = copy.deepcopy(forged)
    r = mutate(forged, POLICY, NS)
    assert not r.injected and r.patch == [] and r.pod == before
    assert r.skipped == [OWNERSHIP_SKIPPED]
    assert r.reason.startswith("not a pod of PyTorchJob llama: the pod has no controller")
    assert r.warnings == [
        "kubeckpt: not injected as a pod of PyTorchJob llama: the pod has no controller "
        "ownerReference (a PyTorchJob's pods are created by the PyTorchJob)"
    ]


PT_OWNER = pytorchjob_owner("llama")
TJ_OWNER = batch_job_owner("llama")


@pytest.mark.parametrize(
    ("kind", "owners", "why"),
    [
        ("PyTorchJob", [], "has no controller ownerReference"),
        ("PyTorchJob", [{**PT_OWNER, "controller": False}], "has no controller ownerReference"),
        ("PyTorchJob", [{**PT_OWNER, "controller": "true"}], "has no controller ownerReference"),
        (
            "PyTorchJob",
            [{**PT_OWNER, "name": "other"}],
            "controller is PyTorchJob other, not llama",
        ),
        (
            "PyTorchJob",
            [{**PT_OWNER, "apiVersion": "example.com/v1"}],
            "controller is PyTorchJob llama of example.com/v1",
        ),
        (
            "PyTorchJob",
            [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "controller": True}],
            "controller is ReplicaSet x of apps/v1",
        ),
        ("PyTorchJob", [{**PT_OWNER, "name": ""}], "has no name"),
        ("PyTorchJob", "not a list", "has no controller ownerReference"),
        ("TrainJob", [], "has no controller ownerReference"),
        ("TrainJob", [PT_OWNER], "controller is PyTorchJob llama of kubeflow.org/v1"),
        ("TrainJob", [{**TJ_OWNER, "name": "other-node-0"}], "not one of TrainJob llama"),
        ("TrainJob", [{**TJ_OWNER, "name": "llama"}], "not one of TrainJob llama"),
        # the Job controller's own labels on the pod name the pod's Job and its UID
        ("TrainJob", [{**TJ_OWNER, "name": "llama-node-1"}], "labels name another Job"),
        ("TrainJob", [{**TJ_OWNER, "uid": "u-2"}], "its labels name another Job's UID"),
    ],
)
def test_a_controller_that_disagrees_with_the_labels_is_not_the_job(
    kind: str, owners: Any, why: str
) -> None:
    p = with_owners(operator_pod(kind, "llama", "team-a"), owners)
    r = mutate(p, POLICY, NS)
    assert not r.injected and r.patch == [] and r.skipped == [OWNERSHIP_SKIPPED]
    assert why in r.reason and why in r.warnings[0], r.reason


def test_a_trainjob_pod_without_the_job_controllers_labels_still_needs_a_matching_owner() -> None:
    p = operator_pod("TrainJob", "llama", "team-a")
    for label in ("batch.kubernetes.io/job-name", "batch.kubernetes.io/controller-uid"):
        del p["metadata"]["labels"][label]
    assert mutate(p, POLICY, NS).injected
    assert not mutate(with_owners(p, [{**TJ_OWNER, "name": "x-node-0"}]), POLICY, NS).injected


def test_the_ownership_check_comes_after_opt_in() -> None:
    """A pod that did not opt in is left alone silently, forged or not."""
    forged = with_owners(operator_pod("PyTorchJob", "llama", "team-a"), None)
    r = mutate(forged, POLICY, {"metadata": {"name": "team-a"}})
    assert (r.reason, r.warnings, r.skipped) == ("not opted in", [], [])


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
owner_refs = st.one_of(
    junk,
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "apiVersion": st.sampled_from(["kubeflow.org/v1", "batch/v1", "v1", "", "/"]),
                "kind": st.sampled_from(["PyTorchJob", "Job", "Pod"]) | junk,
                "name": st.sampled_from(["llama", "llama-node-0", ""]) | junk,
                "uid": junk,
                "controller": st.booleans() | junk,
            },
        ),
        max_size=3,
    ),
)


@given(owners=owner_refs, labels=st.dictionaries(st.text(max_size=30), st.text(max_size=12)))
def test_any_metadata_gives_an_answer_never_an_exception(owners: Any, labels: dict) -> None:
    for kind in (PYTORCHJOB, TRAINJOB):
        for meta in ({"ownerReferences": owners, "labels": labels}, {"ownerReferences": owners}):
            got = ownership_problem(JobIdentity(kind, "llama"), meta)
            assert got is None or (isinstance(got, str) and got)


async def test_the_server_warns_and_counts_a_forged_pod() -> None:
    metrics = Metrics()
    app = make_app(StaticView(namespaces=[NS], policies=[POLICY]), metrics=metrics)
    forged = with_owners(operator_pod("PyTorchJob", "llama", "team-a"), None)
    async with TestClient(TestServer(app)) as client:
        body = await (await client.post("/mutate", json=review(forged))).json()
        text = await (await client.get("/metrics")).text()
    r = body["response"]
    assert r["allowed"] is True and "patch" not in r
    assert r["warnings"][0].startswith("kubeckpt: not injected as a pod of PyTorchJob llama")
    assert 'kubeckpt_webhook_requests_total{result="skipped"} 1.0' in text
    assert 'kubeckpt_webhook_skipped_fields_total{field="ownership"} 1.0' in text
