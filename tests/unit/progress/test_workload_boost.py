"""The priority-boost writer: which Workload is whose job, the ownership rule (never fight another
field manager), the churn rule, and the controller shell's one apply."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from progress_controller import discovery as d
from progress_controller.controller import ProgressController
from progress_controller.main import parse_args
from progress_controller.preemption_cost import PRIORITY_BOOST_ANNOTATION
from progress_controller.preemption_cost_controller import (
    JOB_UID_INDEX,
    WORKLOADS,
    PreemptionCostController,
    workload_job_uid_index,
)
from progress_controller.workload_boost import (
    FIELD_MANAGER,
    Decision,
    WriteRule,
    annotation_managers,
    applied_configuration,
    decide,
    status_echoes,
    trim_workload,
    workload_job,
)
from progress_controller.workloads import trim_workload as shared_trim_workload
from reconciler.client import Client
from reconciler.clock import FakeClock
from reconciler.config import ClientConfig
from reconciler.controller import Request
from reconciler.errors import Conflict, ResourceNotFound
from reconciler.informer import Informer
from reconciler.manager import Manager

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
JOB_UID = "job-uid-1"


def _entry(manager: str, *, when: datetime = NOW, operation: str = "Apply", **extra: Any):
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{PRIORITY_BOOST_ANNOTATION}": {}}}},
        **extra,
    }


def workload(
    value: str | None = None,
    managers: list[dict[str, Any]] | None = None,
    *,
    kind: d.JobKind = d.PYTORCHJOB,
) -> dict[str, Any]:
    md: dict[str, Any] = {
        "name": "pytorchjob-train-abcde",
        "namespace": "ml",
        "uid": "wl-uid",
        "creationTimestamp": "2026-01-01T10:00:00Z",
        "labels": {"kueue.x-k8s.io/job-uid": JOB_UID},
        "ownerReferences": [
            {
                "apiVersion": kind.api_version,
                "kind": kind.kind,
                "name": "train",
                "uid": JOB_UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": [
            {
                "manager": "kueue",
                "operation": "Update",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:kueue.x-k8s.io/job-uid": {}}}},
            },
            *(managers or []),
        ],
    }
    if value is not None:
        md["annotations"] = {PRIORITY_BOOST_ANNOTATION: value, "other": "x"}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": md,
        "spec": {"podSets": [{"name": "master", "count": 1, "template": {"spec": {}}}]},
    }


# --- which Workload is whose job ---


@pytest.mark.parametrize("kind", d.JOB_KINDS, ids=lambda k: k.kind)
def test_a_workload_is_the_job_that_controls_it(kind):
    job = workload_job(workload(kind=kind))
    assert job is not None and (job.kind, job.name, job.uid) == (kind, "train", JOB_UID)


@pytest.mark.parametrize(
    "refs",
    [
        [],
        [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": "u",
                "controller": True,
            }
        ],
        # The group must be the kind's: a PyTorchJob of another API group is not ours.
        [
            {
                "apiVersion": "x.io/v1",
                "kind": "PyTorchJob",
                "name": "t",
                "uid": "u",
                "controller": True,
            }
        ],
        # An owner that is not the controller does not name the job.
        [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t", "uid": "u"}],
        [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t", "controller": True}],
    ],
)
def test_other_workloads_are_nobodys(refs):
    wl = workload()
    wl["metadata"]["ownerReferences"] = refs
    assert workload_job(wl) is None


# --- ownership ---


def test_annotation_managers_reads_managed_fields():
    wl = workload("10", [_entry(FIELD_MANAGER), _entry("admin", operation="Update")])
    assert set(annotation_managers(wl)) == {FIELD_MANAGER, "admin"}
    # A status entry cannot own metadata; kueue's own entry owns only its label.
    wl = workload("10", [_entry("kueue", subresource="status")])
    assert annotation_managers(wl) == {}


def test_kueues_status_echo_is_not_a_writer_and_is_forced_over():
    """Kueue v0.17 applies a Workload's status with its annotations as it read them (pkg/workload
    BaseSSAWorkload): the API server keeps the value and records the status entry as a co-owner,
    so an unforced apply is a 409. The echo is written over, forced; a real writer is not."""
    echo = _entry("kueue-admission", subresource="status")
    wl = workload("36", [_entry(FIELD_MANAGER, when=NOW - timedelta(minutes=5)), echo])
    assert status_echoes(wl) == ("kueue-admission",)
    assert set(annotation_managers(wl)) == {FIELD_MANAGER}
    assert decide(wl, 0, now=NOW) == Decision("write", "0", force=True)
    assert decide(wl, 60, now=NOW) == Decision("write", "60", force=True)
    assert decide(wl, 36, now=NOW).action == "unchanged"
    # Echoed before we ever wrote (Kueue admitted the job with a value set at creation).
    assert decide(workload("7", [echo]), 40, now=NOW) == Decision("write", "40", force=True)
    # Without an echo nothing is forced; with a writer beside it nothing is written at all.
    assert decide(workload(), 40, now=NOW).force is False
    admin = _entry("platform-admin", operation="Update")
    assert decide(workload("36", [echo, admin]), 0, now=NOW).action == "foreign"


def test_a_stale_echo_that_took_our_value_is_not_written_over_again():
    """A status write that Kueue forces from a cache behind ours (after its restart) takes our
    entry's ownership of the annotation while the API server keeps our value (a status write
    cannot change metadata; test_kueue_preemption.py). The value is right: nothing to write.
    The next change is written, forced, and at once (our entry has no time to rate-limit by)."""
    ours_emptied = {k: v for k, v in _entry(FIELD_MANAGER).items() if k != "fieldsV1"}
    wl = workload("0", [_entry("kueue-admission", subresource="status")])
    wl["metadata"]["managedFields"].append(ours_emptied)
    assert annotation_managers(wl) == {}
    assert decide(wl, 0, now=NOW).action == "unchanged"
    assert decide(wl, 40, now=NOW) == Decision("write", "40", force=True)


def test_written_when_nobody_owns_the_annotation():
    assert decide(workload(), 40, now=NOW).action == "write"
    assert decide(workload(), 40, now=NOW).value == "40"
    # Present but owned by nobody (set at creation, say): ours to write.
    assert decide(workload("7"), 40, now=NOW).value == "40"


def test_written_when_we_own_it():
    wl = workload("10", [_entry(FIELD_MANAGER, when=NOW - timedelta(minutes=5))])
    assert decide(wl, 40, now=NOW).value == "40"


@pytest.mark.parametrize("operation", ["Update", "Apply"])
def test_never_written_when_another_manager_owns_it(operation):
    wl = workload("500", [_entry("platform-boost", operation=operation)])
    for boost in (0, 40, 500, None):
        decision = decide(wl, boost, now=NOW)
        assert decision.action == "foreign" and not decision.write
        assert decision.owners == ("platform-boost",)
    # Shared ownership (both applied the same value): still another's say.
    wl = workload("40", [_entry(FIELD_MANAGER), _entry("kubectl-edit", operation="Update")])
    assert decide(wl, 0, now=NOW).action == "foreign"


def test_nothing_to_write_without_a_value():
    assert decide(workload(), None, now=NOW).action == "no-value"


# --- churn ---


def test_no_write_when_the_value_is_unchanged():
    wl = workload("40", [_entry(FIELD_MANAGER, when=NOW - timedelta(hours=1))])
    assert decide(wl, 40, now=NOW).action == "unchanged"
    # Kueue reads a missing annotation as 0: a new, pending job's Workload is not written.
    assert decide(workload(), 0, now=NOW).action == "unchanged"


def test_a_small_change_waits():
    wl = workload("40", [_entry(FIELD_MANAGER, when=NOW - timedelta(hours=1))])
    assert decide(wl, 44, now=NOW, rule=WriteRule(min_change=5)).action == "not-yet"
    assert decide(wl, 45, now=NOW, rule=WriteRule(min_change=5)).value == "45"


def test_a_recent_write_delays_the_next():
    wl = workload("40", [_entry(FIELD_MANAGER, when=NOW - timedelta(seconds=10))])
    decision = decide(wl, 60, now=NOW, rule=WriteRule(min_interval=30))
    assert decision.action == "not-yet" and decision.after == pytest.approx(20)
    assert decide(wl, 60, now=NOW + timedelta(seconds=20), rule=WriteRule()).write


def test_a_fall_is_written_at_once_and_a_rise_waits():
    wl = workload("40", [_entry(FIELD_MANAGER, when=NOW - timedelta(seconds=1))])
    assert decide(wl, 20, now=NOW).value == "20"  # a new checkpoint: cheaper now
    assert decide(wl, 60, now=NOW).action == "not-yet"
    assert decide(wl, 37, now=NOW).action == "not-yet"  # a wobble, not a checkpoint


def test_a_drop_to_zero_is_written_at_once():
    # The job just committed a checkpoint: Kueue should know at once that it is cheap.
    wl = workload("3", [_entry(FIELD_MANAGER, when=NOW)])
    assert decide(wl, 0, now=NOW).value == "0"


@given(
    st.integers(0, 1000),
    st.integers(0, 1000),
    st.floats(0, 3600),
    st.integers(1, 50),
    st.floats(0, 600),
)
def test_the_rules_hold_for_any_values(have, want, age, min_change, min_interval):
    rule = WriteRule(min_change=min_change, min_interval=min_interval)
    wl = workload(str(have), [_entry(FIELD_MANAGER, when=NOW - timedelta(seconds=int(age)))])
    decision = decide(wl, want, now=NOW, rule=rule)
    assert decide(copy.deepcopy(wl), want, now=NOW, rule=rule) == decision
    if decision.write:
        assert decision.value == str(want) and want != have
        assert want == 0 or (
            abs(want - have) >= min_change and (want < have or int(age) >= min_interval)
        )
    else:
        assert want == have or (want != 0 and decision.action == "not-yet")


def test_rule_settings_are_checked():
    for bad in ({"min_change": 0}, {"min_change": True}, {"min_interval": -1.0}):
        with pytest.raises(ValueError):
            WriteRule(**bad)


# --- what is sent and cached ---


def test_the_applied_configuration_is_the_annotation_alone():
    body = applied_configuration(workload("1"), "40")
    assert body == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "pytorchjob-train-abcde",
            "namespace": "ml",
            "annotations": {PRIORITY_BOOST_ANNOTATION: "40"},
        },
    }


@pytest.mark.parametrize(
    "managers",
    [
        [],
        [_entry(FIELD_MANAGER)],
        [_entry("admin", operation="Update"), _entry(FIELD_MANAGER)],
        [_entry(FIELD_MANAGER), _entry("kueue-admission", subresource="status")],
    ],
)
@pytest.mark.parametrize("value", [None, "12"])
def test_the_trimmed_workload_decides_the_same(managers, value):
    wl = workload(value, managers)
    trimmed = trim_workload(copy.deepcopy(wl))
    assert "spec" not in trimmed and trimmed["metadata"].get("annotations", {}).get("other") is None
    assert workload_job(trimmed) == workload_job(wl)
    assert annotation_managers(trimmed) == annotation_managers(wl)
    assert status_echoes(trimmed) == status_echoes(wl)
    for boost in (None, 0, 12, 40):
        assert decide(trimmed, boost, now=NOW) == decide(wl, boost, now=NOW)


# --- the flag ---


def test_the_writer_is_off_unless_turned_on():
    assert parse_args([]).preemption_cost is False
    args = parse_args(["--preemption-cost", "--preemption-cost-max-boost=50"])
    assert args.preemption_cost and args.cost_settings.max_boost == 50
    with pytest.raises(SystemExit):
        parse_args(["--preemption-cost-max-boost=0"])


# --- the controller shell ---


def _job() -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": JOB_UID,
            "creationTimestamp": "2026-01-01T10:00:00Z",
        },
    }


def _tp(status: dict[str, Any], uid: str = JOB_UID) -> dict[str, Any]:
    return {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "TrainingProgress",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "tp-uid",
            "resourceVersion": "3",
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "train",
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "jobRef": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train"}
        },
        "status": status,
    }


RUNNING = {
    "state": "Training",
    "step": 1900,
    "stepSeconds": "2",
    "checkpointing": {
        "latestCheckpoint": "checkpoint-100",
        "latestCheckpointTime": "2026-01-01T11:00:00Z",
        "lastSaveSeconds": "20",
    },
}


class _Shell:
    def __init__(self, wl: dict[str, Any], tp: dict[str, Any] | None) -> None:
        client = Client(ClientConfig("http://127.0.0.1:9", qps=None))  # never reached
        manager = Manager(client, port=None)
        self.progress = ProgressController(manager, clock=FakeClock())
        self.ctrl = PreemptionCostController(manager, self.progress, wall=lambda: NOW)
        self.applied: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.conflict = False

        async def fake_apply(obj: Any, **kw: Any) -> dict:
            if self.conflict:
                cause = {"reason": "FieldManagerConflict", "field": PRIORITY_BOOST_ANNOTATION}
                raise Conflict(409, "Conflict", body={"details": {"causes": [cause]}})
            self.applied.append((obj, kw))
            return obj

        # As _discover makes it once the Workload API is found.
        self.ctrl.api = manager.client.api(WORKLOADS)
        self.ctrl.workloads = Informer(
            self.ctrl.api,
            indexers={JOB_UID_INDEX: workload_job_uid_index},
            transform=trim_workload,
        )
        self.ctrl.api.apply = fake_apply  # type: ignore[method-assign]
        for inf, obj in ((self.progress.jobs, _job()), (self.ctrl.workloads, wl)):
            fresh = copy.deepcopy(obj)
            inf.store.put(inf.transform(fresh) if inf.transform else fresh)
        if tp is not None:
            inf = self.progress.tps
            inf.store.put(inf.transform(copy.deepcopy(tp)) if inf.transform else tp)
        self.request = Request("ml", wl["metadata"]["name"])

    def run(self) -> Any:
        return asyncio.run(self.ctrl.reconcile(self.request))


def test_a_write_the_cache_has_not_seen_yet_is_not_repeated():
    """A TrainingProgress update can reconcile the Workload before the watch brings back the
    boost just written: the cache still holds the old value, and writing it again would be churn
    (seen on a loaded API server). Once the cache holds a newer version, decide() rules again."""
    wl = workload()
    wl["metadata"]["resourceVersion"] = "10"
    shell = _Shell(wl, _tp(RUNNING))
    shell.run()
    shell.run()
    assert len(shell.applied) == 1 and shell.ctrl.stats["unseen"] == 1
    newer = copy.deepcopy(wl)
    newer["metadata"]["resourceVersion"] = "11"  # a version without our value (someone reset it)
    shell.ctrl.workloads.store.put(trim_workload(newer))
    shell.run()
    assert len(shell.applied) == 2


def test_the_shell_applies_the_annotation_alone_never_forced():
    shell = _Shell(workload(), _tp(RUNNING))
    result = shell.run()
    ((body, kw),) = shell.applied
    # 1800 steps x 2 s + 20 s of save: an hour's work at risk.
    assert body["metadata"]["annotations"] == {PRIORITY_BOOST_ANNOTATION: "56"}
    assert kw == {"field_manager": FIELD_MANAGER, "force": False}
    assert result is not None and result.requeue_after == 30.0  # running: its cost grows


def test_the_shell_forces_only_over_kueues_status_echo():
    echo = _entry("kueue-admission", subresource="status")
    ours = _entry(FIELD_MANAGER, when=NOW - timedelta(minutes=5))
    shell = _Shell(workload("36", [ours, echo]), _tp(RUNNING))
    shell.run()
    ((body, kw),) = shell.applied
    assert body["metadata"]["annotations"] == {PRIORITY_BOOST_ANNOTATION: "56"}
    assert kw == {"field_manager": FIELD_MANAGER, "force": True}


def test_the_shell_leaves_a_foreign_annotation_alone():
    shell = _Shell(workload("900", [_entry("platform-boost", operation="Update")]), _tp(RUNNING))
    shell.run()
    assert shell.applied == [] and shell.ctrl.stats["foreign"] == 1


def test_a_conflict_from_the_server_is_not_retried():
    shell = _Shell(workload(), _tp(RUNNING))
    shell.conflict = True
    assert shell.run() is None
    assert shell.ctrl.stats["conflicts"] == 1


@pytest.mark.parametrize(
    "tp",
    [
        None,  # not a kubeckpt job
        _tp(RUNNING, uid="another-job"),  # a predecessor's TrainingProgress
        _tp({**RUNNING, "stepSeconds": "99999"}),  # out of range
        _tp({**RUNNING, "state": "Succeeded"}),
    ],
)
def test_nothing_is_written_without_a_believable_cost(tp):
    shell = _Shell(workload(), tp)
    shell.run()
    assert shell.applied == []


def test_a_suspended_job_gets_the_neutral_boost():
    shell = _Shell(workload("56", [_entry(FIELD_MANAGER)]), _tp({**RUNNING, "state": "Suspended"}))
    assert shell.run() is None
    ((body, _),) = shell.applied
    assert body["metadata"]["annotations"] == {PRIORITY_BOOST_ANNOTATION: "0"}


def test_a_progress_update_reaches_the_jobs_workload():
    shell = _Shell(workload(), _tp(RUNNING))
    assert shell.ctrl._progress_to_workloads(_tp(RUNNING)) == [shell.request]
    assert shell.ctrl._progress_to_workloads(_tp(RUNNING, uid="x")) == []


async def test_the_workload_informer_starts_only_once_kueue_is_there():
    """Without Kueue the writer waits (the progress controller's informers alone gate
    readiness); once discovery finds the Workload API, the progress controller's shared Workload
    informer starts and the writer watches it."""
    client = Client(ClientConfig("http://127.0.0.1:9", qps=None))  # never reached
    manager = Manager(client, port=None)
    progress = ProgressController(manager, clock=FakeClock())
    ctrl = PreemptionCostController(manager, progress)
    assert all(inf.name != "workloads" for inf in manager.informers.values())
    served = False

    async def resource(api_version: str, plural: str) -> Any:
        assert (api_version, plural) == ("kueue.x-k8s.io/v1beta2", "workloads")
        if not served:
            raise ResourceNotFound("no such API")
        return WORKLOADS

    client.resource = resource  # type: ignore[method-assign]
    watcher = progress.workloads
    assert await watcher._discover() is False and ctrl.workloads is None
    assert ctrl._progress_to_workloads(_tp(RUNNING)) == []
    assert await ctrl.reconcile(Request("ml", "w")) is None
    served = True
    try:
        assert await watcher._discover() is True
        assert ctrl.workloads is not None and ctrl.workloads is watcher.informer
        assert ctrl.workloads.transform is shared_trim_workload
        assert await watcher._discover() is True  # once
        # A consumer that comes later is told at once, with the same informer.
        seen: list[Any] = []
        watcher.on_informer(lambda inf, api: seen.append((inf, api)))
        assert seen == [(watcher.informer, watcher.api)]
    finally:
        assert watcher._task is not None
        watcher._task.cancel()
    await client.close()
