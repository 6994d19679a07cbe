"""Why Kueue suspended a job: Kueue v0.17's Workload conditions -> an Eviction, its words in the
TrainingProgress, one Evicted Event per eviction; hostile or oversized values bounded; and the
controller shell that finds the job's Workload and its preemptor in the shared cache."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubeckpt_api.status import MAX_CONDITION_MESSAGE, condition
from progress_controller.controller import ProgressController, workload_to_job
from progress_controller.decide import Observation, decide
from progress_controller.kueue_eviction import (
    MAX_CACHED_MESSAGE,
    MAX_QUOTED,
    Eviction,
    describe_preemptor,
    eviction_of,
)
from progress_controller.workloads import (
    JOB_UID_INDEX,
    UID_INDEX,
    WORKLOADS,
    WorkloadWatcher,
    trim_workload,
    workload_job_uid_index,
    workload_uid_index,
)
from reconciler.client import Client
from reconciler.clock import FakeClock
from reconciler.config import ClientConfig
from reconciler.controller import Request
from reconciler.informer import Informer
from reconciler.manager import Manager

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
VICTIM_UID = "job-uid-low"
PREEMPTOR_WL_UID = "6f1c2a9e-0000-4000-8000-000000000001"
PREEMPTOR_JOB_UID = "job-uid-high"
# What Kueue v0.17's preemptionMessage writes (pkg/scheduler/preemption/preemption.go).
MESSAGE = (
    f"Preempted to accommodate a workload (UID: {PREEMPTOR_WL_UID}, JobUID: {PREEMPTOR_JOB_UID}) "
    "due to prioritization in the ClusterQueue; preemptor path: /cq; preemptee path: /cq"
)


def _cond(type_: str, status: str, reason: str, message: str = MESSAGE, when: str = "") -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": when or "2026-01-01T11:59:30Z",
        "observedGeneration": 1,
    }


def _workload(
    name: str, job: str, job_uid: str, conditions: list[dict] | None = None, uid: str = "wl-low"
) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "labels": {"kueue.x-k8s.io/job-uid": job_uid},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": job,
                    "uid": job_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"podSets": [{"name": "master", "count": 1, "template": {"spec": {}}}]},
        "status": {"conditions": conditions or []},
    }


PREEMPTED = [
    _cond("QuotaReserved", "False", "Pending", "waiting"),
    _cond("Evicted", "True", "Preempted"),
    _cond("Preempted", "True", "InClusterQueue"),
]


# --- conditions -> Eviction ---


def test_a_preemption_names_the_reason_the_place_and_the_preemptor():
    ev = eviction_of(_workload("low", "low", VICTIM_UID, PREEMPTED))
    assert ev == Eviction(
        reason="Preempted",
        since="2026-01-01T11:59:30Z",
        preemption="InClusterQueue",
        preemptor_uid=PREEMPTOR_WL_UID,
        preemptor_job_uid=PREEMPTOR_JOB_UID,
    )
    assert ev.describe("PyTorchJob ml/high") == (
        "evicted by Kueue at 2026-01-01T11:59:30Z (Preempted: InClusterQueue) "
        "to admit PyTorchJob ml/high"
    )


@pytest.mark.parametrize(
    "conditions",
    [
        [],  # admitted, never evicted
        [_cond("QuotaReserved", "False", "Pending", "queued")],  # queued: suspended, not evicted
        # Readmitted: Kueue turns both False ("Previously: ...") when it reserves quota again.
        [
            _cond("Evicted", "False", "QuotaReserved", "Previously: " + MESSAGE),
            _cond("Preempted", "False", "QuotaReserved", "Previously: " + MESSAGE),
        ],
    ],
)
def test_no_eviction_unless_evicted_is_true(conditions):
    assert eviction_of(_workload("low", "low", VICTIM_UID, conditions)) is None


def test_an_eviction_that_is_not_a_preemption_quotes_kueue_bounded():
    long = "PodsReady timeout exceeded\n" + "x" * 50_000
    ev = eviction_of(
        _workload("low", "low", VICTIM_UID, [_cond("Evicted", "True", "PodsReadyTimeout", long)])
    )
    assert ev is not None and ev.reason == "PodsReadyTimeout" and ev.preemption is None
    assert ev.preemptor_uid is None and len(ev.quoted) == MAX_QUOTED
    assert ev.quoted.startswith("PodsReady timeout exceeded x") and "\n" not in ev.quoted
    assert ev.describe().startswith("evicted by Kueue at 2026-01-01T11:59:30Z (PodsReadyTimeout): ")


def test_unknown_uids_are_not_a_preemptor():
    msg = "Preempted to accommodate a workload (UID: UNKNOWN, JobUID: UNKNOWN) due to UNKNOWN"
    ev = eviction_of(
        _workload(
            "low",
            "low",
            VICTIM_UID,
            [_cond("Evicted", "True", "Preempted", msg), _cond("Preempted", "True", "", msg)],
        )
    )
    assert ev is not None and ev.preemptor_uid is None and ev.preemptor_job_uid is None
    assert ev.preemption is None  # "" is not a reason
    assert describe_preemptor(ev, lambda uid: None) is None


@pytest.mark.parametrize(
    "reason",
    ["", "1abc", "a b", "x" * 65, "Pre\x1bempted", "Preempted\u202e", None, 5, ["Preempted"]],
)
def test_a_reason_that_is_not_a_condition_reason_is_unknown(reason):
    conds = [_cond("Evicted", "True", "Preempted"), _cond("Preempted", "True", "InClusterQueue")]
    conds[0]["reason"] = reason
    conds[1]["reason"] = reason
    ev = eviction_of(_workload("low", "low", VICTIM_UID, conds))
    assert ev is not None and ev.reason == "Unknown" and ev.preemption is None


@pytest.mark.parametrize(
    "message",
    [
        "Preempted to accommodate a workload (UID: \x1b[31mevil, JobUID: x)",
        "Preempted to accommodate a workload (UID: " + "a" * 65 + ", JobUID: b)",
        "Preempted to accommodate a workload (UID: a/b, JobUID: c)",
        "x" * MAX_CACHED_MESSAGE + f"(UID: {PREEMPTOR_WL_UID}, JobUID: j)",  # past what is read
    ],
)
def test_a_uid_that_is_not_one_is_not_taken(message):
    conds = [_cond("Evicted", "True", "Preempted", message)]
    ev = eviction_of(_workload("low", "low", VICTIM_UID, conds))
    assert ev is not None and ev.preemptor_uid is None and ev.preemptor_job_uid is None
    assert len(ev.quoted) <= MAX_QUOTED and "\x1b" not in ev.quoted


@pytest.mark.parametrize("when", ["not a time", "", None, 12])
def test_a_transition_time_that_is_not_one_is_left_out(when):
    conds = [_cond("Evicted", "True", "Preempted")]
    conds[0]["lastTransitionTime"] = when
    ev = eviction_of(_workload("low", "low", VICTIM_UID, conds))
    assert ev is not None and ev.since is None
    assert ev.describe().startswith("evicted by Kueue (Preempted)")


@given(
    st.dictionaries(
        st.sampled_from(["type", "status", "reason", "message", "lastTransitionTime"]),
        st.one_of(st.text(max_size=3000), st.integers(), st.none(), st.lists(st.text())),
    ),
    st.text(max_size=600),
)
def test_any_conditions_give_a_bounded_printable_text_or_none(extra, preemptor):
    conds = [{**_cond("Evicted", "True", "Preempted"), **extra}, extra]
    ev = eviction_of(_workload("low", "low", VICTIM_UID, conds))
    if ev is None:
        return
    name = describe_preemptor(ev, lambda uid: None)
    text = ev.describe(name)
    assert len(text) < 600 and text.isprintable()
    # The status message that carries it is bounded as every condition message is.
    status = decide({}, Observation(suspended=True, eviction=ev, preemptor=name), NOW).status
    assert len(condition(status["conditions"], "Progressing")["message"]) <= MAX_CONDITION_MESSAGE


# --- the preemptor by name ---


def test_the_preemptor_is_named_by_its_job_when_its_workload_is_cached():
    ev = eviction_of(_workload("low", "low", VICTIM_UID, PREEMPTED))
    assert ev is not None
    high = _workload("pytorchjob-high-1", "high", PREEMPTOR_JOB_UID, uid=PREEMPTOR_WL_UID)
    cache = {PREEMPTOR_WL_UID: trim_workload(high)}
    assert describe_preemptor(ev, cache.get) == ("PyTorchJob ml/high (Workload pytorchjob-high-1)")
    # Gone from the cache (the preemptor finished and was deleted): the UIDs Kueue gave.
    assert describe_preemptor(ev, lambda uid: None) == f"the Workload with UID {PREEMPTOR_WL_UID}"
    plain = copy.deepcopy(high)
    plain["metadata"]["ownerReferences"] = []
    assert describe_preemptor(ev, {PREEMPTOR_WL_UID: plain}.get) == (
        "Workload ml/pytorchjob-high-1"
    )


# --- the status and the Event ---


def _evicted(since: str = "2026-01-01T11:59:30Z") -> Eviction:
    return Eviction("Preempted", since, "InClusterQueue", PREEMPTOR_WL_UID, PREEMPTOR_JOB_UID)


RUNNING = {"step": 40, "checkpointing": {"latestCheckpoint": "/ckpt/checkpoint-40"}}


def test_the_suspended_status_says_kueue_evicted_it_and_the_event_comes_once():
    obs = Observation(suspended=True, eviction=_evicted(), preemptor="PyTorchJob ml/high")
    first = decide(RUNNING, obs, NOW)
    assert first.status["state"] == "Suspended"
    progressing = condition(first.status["conditions"], "Progressing")
    assert progressing["reason"] == "Suspended"
    assert progressing["message"] == (
        "evicted by Kueue at 2026-01-01T11:59:30Z (Preempted: InClusterQueue) to admit "
        "PyTorchJob ml/high; the job is suspended at step 40; it resumes from "
        "/ckpt/checkpoint-40 when unsuspended"
    )
    assert [(e.type, e.reason, e.message) for e in first.events] == [
        ("Normal", "Evicted", progressing["message"])
    ]
    # The next polls of the same eviction (a restarted controller reads the same status): none.
    later = NOW + timedelta(minutes=1)
    again = decide(first.status, obs, later)
    assert again.events == [] and again.status["state"] == "Suspended"
    # The JIT record read from the termination message moves the step: still no second Event.
    moved = decide({**first.status, "step": 41}, obs, later)
    assert moved.events == []
    # A preemptor gone from the cache changes the words, not the eviction: none either.
    assert (
        decide(first.status, Observation(suspended=True, eviction=_evicted()), later).events == []
    )


def test_a_new_eviction_is_a_new_event():
    first = decide(RUNNING, Observation(suspended=True, eviction=_evicted()), NOW).status
    second = decide(
        first, Observation(suspended=True, eviction=_evicted("2026-01-01T12:30:00Z")), NOW
    )
    assert [e.reason for e in second.events] == ["Evicted"]


def test_the_eviction_seen_after_the_suspension_is_told_once():
    """The job's suspend can reach the cache before its Workload's Evicted condition does."""
    plain = decide(RUNNING, Observation(suspended=True), NOW)
    assert plain.events == [] and "Kueue" not in str(plain.status["conditions"])
    told = decide(plain.status, Observation(suspended=True, eviction=_evicted()), NOW)
    assert [e.reason for e in told.events] == ["Evicted"]


def test_a_long_checkpoint_path_never_cuts_the_eviction():
    status = {"step": 1, "checkpointing": {"latestCheckpoint": "/c/" + "d" * 3000}}
    obs = Observation(suspended=True, eviction=_evicted(), preemptor="PyTorchJob ml/high")
    first = decide(status, obs, NOW)
    msg = condition(first.status["conditions"], "Progressing")["message"]
    assert len(msg) == MAX_CONDITION_MESSAGE and msg.startswith(_evicted().key + " (")
    assert decide(first.status, obs, NOW).events == []


def test_no_kueue_no_change():
    """Without an eviction the suspended status is what it always was."""
    status = decide(RUNNING, Observation(suspended=True), NOW).status
    assert condition(status["conditions"], "Progressing")["message"] == (
        "the job is suspended at step 40; it resumes from /ckpt/checkpoint-40 when unsuspended"
    )


# --- the controller shell ---


def test_a_workload_maps_to_its_jobs_request():
    wl = _workload("pytorchjob-low-1", "low", VICTIM_UID, PREEMPTED)
    assert workload_to_job(wl) == [Request("ml", "low")]
    wl["metadata"]["ownerReferences"][0]["kind"] = "Deployment"
    assert workload_to_job(wl) == []


def test_the_cache_keeps_the_eviction_conditions_only_bounded():
    big = _cond("Evicted", "True", "Preempted", MESSAGE + "y" * 40_000)
    wl = _workload("low", "low", VICTIM_UID, [*PREEMPTED[:1], big, PREEMPTED[2]])
    trimmed = trim_workload(wl)
    assert "spec" not in trimmed
    assert [c["type"] for c in trimmed["status"]["conditions"]] == ["Evicted", "Preempted"]
    assert all(len(c["message"]) <= MAX_CACHED_MESSAGE for c in trimmed["status"]["conditions"])
    assert eviction_of(trimmed) == eviction_of(wl)
    assert "status" not in trim_workload(_workload("low", "low", VICTIM_UID))


def _controller() -> tuple[ProgressController, Informer]:
    client = Client(ClientConfig("http://127.0.0.1:9", qps=None))  # never reached
    manager = Manager(client, port=None)
    progress = ProgressController(manager, clock=FakeClock())
    watcher: WorkloadWatcher = progress.workloads
    # As WorkloadWatcher._discover makes it once the Workload API is found.
    watcher.api = client.api(WORKLOADS)
    watcher.informer = Informer(
        watcher.api,
        indexers={JOB_UID_INDEX: workload_job_uid_index, UID_INDEX: workload_uid_index},
        transform=trim_workload,
    )
    return progress, watcher.informer


def test_the_shell_finds_the_eviction_and_names_the_preemptor():
    progress, informer = _controller()
    job = {"metadata": {"name": "low", "namespace": "ml", "uid": VICTIM_UID}}
    assert progress._kueue_eviction(job) == (None, None)
    for wl in (
        _workload("pytorchjob-low-1", "low", VICTIM_UID, PREEMPTED),
        _workload("pytorchjob-high-1", "high", PREEMPTOR_JOB_UID, uid=PREEMPTOR_WL_UID),
    ):
        informer.store.put(trim_workload(wl))
    eviction, preemptor = progress._kueue_eviction(job)
    assert eviction is not None and eviction.preemption == "InClusterQueue"
    assert preemptor == "PyTorchJob ml/high (Workload pytorchjob-high-1)"
    # The preemptor's own job is not evicted.
    high = {"metadata": {"name": "high", "namespace": "ml", "uid": PREEMPTOR_JOB_UID}}
    assert progress._kueue_eviction(high) == (None, None)
    asyncio.run(progress.client.close())
