"""The TrainingProgress a pod's grace period is sized from is its job's, found by spec.jobRef
(kind, API group, name) and, where the pod names its job's UID, ownership; never by the object's
name alone (R2-common: a PyTorchJob and a TrainJob named alike have two TrainingProgresses, the
second one `<name>-<kind>`)."""

from __future__ import annotations

import copy

import pytest

from kubeckpt_api.jobkinds import PYTORCHJOB, TRAINJOB, JobIdentity
from tests.support.operator_pods import operator_pod, training_progress
from webhook.server import decide
from webhook.view import StaticView, job_ref_index

NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}
POLICY = {
    "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {"storage": {"uri": "pvc://ckpt/runs"}, "jit": {"maxGracePeriodSeconds": 600}},
}
PT_POD = operator_pod("PyTorchJob", "llama", "team-a")
PT_UID = PT_POD["metadata"]["ownerReferences"][0]["uid"]


def measured(save: str) -> dict:
    return {"stepSeconds": "0", "checkpointing": {"lastSaveSeconds": save}}


def grace(pod: dict, *tps: dict) -> int:
    view = StaticView(namespaces=[NS], policies=[POLICY], progress=list(tps))
    # decide() patches the request's pod in place: hand it a copy
    result = decide(view, {"uid": "u", "namespace": "team-a", "object": copy.deepcopy(pod)})
    assert result.injected, result.reason
    return result.pod["spec"]["terminationGracePeriodSeconds"]


# (save + 0) x 1.5 + 10: a save of 100 s gives 160, of 200 s 310; none measured: the policy's 600
PT_TP = training_progress("llama", "team-a", "PyTorchJob", "llama", PT_UID, measured("100"))
TJ_TP = training_progress(
    "llama-trainjob", "team-a", "TrainJob", "llama", "tj-uid", measured("200")
)


def test_same_named_jobs_of_two_kinds_each_get_their_own_record() -> None:
    assert grace(PT_POD, PT_TP, TJ_TP) == 160
    assert grace(operator_pod("TrainJob", "llama", "team-a"), PT_TP, TJ_TP) == 310
    # the TrainJob came first and holds the plain name: the lookup does not care
    tj_first = {**TJ_TP, "metadata": {**TJ_TP["metadata"], "name": "llama"}}
    pt_second = {**PT_TP, "metadata": {**PT_TP["metadata"], "name": "llama-pytorchjob"}}
    assert grace(PT_POD, tj_first, pt_second) == 160
    assert grace(operator_pod("TrainJob", "llama", "team-a"), tj_first, pt_second) == 310


def test_a_record_named_after_the_job_but_about_another_kind_sizes_nothing() -> None:
    assert grace(PT_POD, {**TJ_TP, "metadata": {**TJ_TP["metadata"], "name": "llama"}}) == 600


def test_a_pytorchjobs_record_must_be_owned_by_the_job_the_pod_names() -> None:
    """An earlier job of the same name (or anyone's object) does not size the new job's pods."""
    other = training_progress("llama", "team-a", "PyTorchJob", "llama", "old-uid", measured("1"))
    assert grace(PT_POD, other) == 600
    assert grace(PT_POD, other, PT_TP) == 160


@pytest.mark.parametrize(
    "ref",
    [
        None,
        "llama",
        {},
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"},
        {"apiVersion": "example.com/v1", "kind": "PyTorchJob", "name": "llama"},
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "llama"},
        {"apiVersion": 1, "kind": "PyTorchJob", "name": "llama"},
        {"apiVersion": "kubeflow.org/v1", "kind": ["PyTorchJob"], "name": "llama"},
    ],
)
def test_records_without_a_usable_job_ref_are_not_indexed(ref: object) -> None:
    tp = {**PT_TP, "spec": {"jobRef": ref}}
    assert job_ref_index(tp) == []
    assert grace(PT_POD, tp) == 600


def test_the_index_keys_kind_group_and_name() -> None:
    assert job_ref_index(PT_TP) == ["team-a/kubeflow.org/PyTorchJob/llama"]
    assert job_ref_index(TJ_TP) == ["team-a/trainer.kubeflow.org/TrainJob/llama"]
    view = StaticView(progress=[PT_TP, TJ_TP])
    assert view.progress("team-a", JobIdentity(PYTORCHJOB, "llama"), PT_UID) is PT_TP
    assert view.progress("team-a", JobIdentity(TRAINJOB, "llama")) is TJ_TP
    assert view.progress("team-b", JobIdentity(TRAINJOB, "llama")) is None


@pytest.mark.parametrize("spec", [None, [], "llama", 7])
def test_records_whose_spec_is_not_an_object_are_not_indexed(spec: object) -> None:
    tp = {**PT_TP, "spec": spec}
    assert job_ref_index(tp) == []
    assert grace(PT_POD, tp) == 600
