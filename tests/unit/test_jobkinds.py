"""The table of job kinds (trainer_runtime.contract.jobkinds, read through kubeckpt_api.jobkinds):
how each kind's pods are recognised, which is rank 0, the target container, and that the
reconciler's RBAC grants what the table needs for every kind (adding a kind is one entry plus its
RBAC)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubeckpt_api.jobkinds import (
    JOB_KINDS,
    PYTORCHJOB,
    TRAINJOB,
    job_identity,
    job_kind,
)
from progress_controller import discovery as d

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "config" / "rbac" / "reconciler_role.yaml"

PT_MASTER = {
    "training.kubeflow.org/job-name": "j",
    "training.kubeflow.org/replica-type": "Master",
    "training.kubeflow.org/replica-index": "0",
}
TJ_RANK0 = {
    "jobset.sigs.k8s.io/jobset-name": "t",
    "jobset.sigs.k8s.io/job-index": "0",
    "batch.kubernetes.io/job-completion-index": "0",
}


def test_identity_from_the_operators_labels() -> None:
    ident = job_identity(PT_MASTER)
    assert ident is not None and (ident.kind, ident.name) == ("PyTorchJob", "j")
    assert ident.target_container == "pytorch"
    ident = job_identity(TJ_RANK0)
    assert ident is not None and (ident.kind, ident.name, ident.target_container) == (
        "TrainJob",
        "t",
        "node",
    )
    assert job_identity({"app": "x"}) is None
    # Another operator's job with the training-operator's labels is not a PyTorchJob.
    tf = {"training.kubeflow.org/job-name": "j", "training.kubeflow.org/operator-name": "tf"}
    assert job_identity(tf) is None
    # A TrainJob's initializer pods download and do not train: not a training pod.
    init = {**TJ_RANK0, "jobset.sigs.k8s.io/replicatedjob-name": "dataset-initializer"}
    assert job_identity(init) is None
    node = {**TJ_RANK0, "jobset.sigs.k8s.io/replicatedjob-name": "node"}
    assert job_identity(node) is not None


@pytest.mark.parametrize(
    ("kind", "labels", "rank0"),
    [
        (PYTORCHJOB, PT_MASTER, True),
        (PYTORCHJOB, {"training.kubeflow.org/job-role": "master"}, True),
        (PYTORCHJOB, {**PT_MASTER, "training.kubeflow.org/replica-index": "1"}, False),
        (PYTORCHJOB, {**PT_MASTER, "training.kubeflow.org/replica-type": "worker"}, False),
        (TRAINJOB, TJ_RANK0, True),
        (TRAINJOB, {**TJ_RANK0, "jobset.sigs.k8s.io/job-index": "1"}, False),
        (TRAINJOB, {**TJ_RANK0, "batch.kubernetes.io/job-completion-index": "1"}, False),
    ],
)
def test_rank0(kind, labels: dict, rank0: bool) -> None:
    assert kind.is_rank0(labels) is rank0
    assert d.is_rank0({"metadata": {"labels": labels}}, kind) is rank0


def test_the_controller_and_the_webhook_read_the_same_table() -> None:
    pod = {
        "metadata": {"labels": TJ_RANK0},
        "spec": {"containers": [{"name": "a"}, {"name": "node"}]},
    }
    kind, name = d.job_of_pod(pod)  # type: ignore[misc]
    assert kind is TRAINJOB and name == "t"
    assert d.target_container(pod, kind) == {"name": "node"}
    assert job_kind("TrainJob") is TRAINJOB and job_kind("MPIJob") is None


def _rules() -> list[dict]:
    docs = [doc for doc in yaml.safe_load_all(ROLE.read_text()) if doc]
    role = next(doc for doc in docs if doc["kind"] == "ClusterRole")
    return role["rules"]


def _granted(group: str, resource: str) -> set[str]:
    verbs: set[str] = set()
    for rule in _rules():
        if group in rule["apiGroups"] and resource in rule["resources"]:
            verbs |= set(rule["verbs"])
    return verbs


@pytest.mark.parametrize("kind", JOB_KINDS, ids=lambda k: k.kind)
def test_rbac_covers_every_kind(kind) -> None:
    """The reconciler watches every kind's jobs; it writes a kind's own status only where the
    table says the kind has a progress field."""
    assert {"list", "watch"} <= _granted(kind.group, kind.plural)
    status = _granted(kind.group, f"{kind.plural}/status")
    if kind.progress_status_field:
        assert status == {"patch"}
    else:
        assert not status, f"{kind.kind}: its status is never written, so no RBAC for it"


def test_the_runtime_warns_of_a_kind_it_does_not_know(caplog: pytest.LogCaptureFixture) -> None:
    from trainer_runtime.config import Config

    Config.from_env({"KUBECKPT_JOB_KIND": "TrainJob"})
    assert not caplog.records
    Config.from_env({"KUBECKPT_JOB_KIND": "MPIJob"})
    assert "MPIJob" in caplog.text and "PyTorchJob, TrainJob" in caplog.text


def test_webhook_match_conditions_are_generated_from_the_kinds() -> None:
    """config/webhook's CEL filter is the one jobkinds generates: a new kind or label there
    reaches the API server's filter too (or this fails)."""
    from kubeckpt_api.jobkinds import admission_match_expression

    mwc = yaml.safe_load(
        (REPO / "config" / "webhook" / "mutatingwebhookconfiguration.yaml").read_text()
    )
    assert len(mwc["webhooks"]) == 2
    for hook in mwc["webhooks"]:
        (cond,) = hook["matchConditions"]
        assert cond["expression"] == admission_match_expression(), hook["name"]
    expr = admission_match_expression()
    for kind in JOB_KINDS:
        assert f"'{kind.name_label}' in object.metadata.labels" in expr
        for key, value in kind.must_match:
            assert f"['{key}'] == '{value}'" in expr
