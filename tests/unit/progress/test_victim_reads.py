"""A rank-0 pod deleted while its replacement is already there (a Job replaces a deleted pod at
once) is still read: by exec while its container runs, by its termination message once it has
terminated, before the replacement, until the replacement's record is taken. So the just-in-time
checkpoint it writes on the way out makes its JITCheckpoint Event and TrainingProgress fields,
and its record is never taken after the replacement's. The pure choice (discovery.read_order),
then the controller's reconcile over a fake exec; also the jobs-by-feed gauge on the reconcile's
early returns."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any
from unittest import mock

from test_cache_trim import JOB, NS, _controller, _FixedNow, _load, _master

from kubeckpt_api.groupversion import TRAINING_PROGRESS
from progress_controller import controller as controller_module
from progress_controller import discovery as d
from progress_controller.controller import ProgressController, _JobState
from progress_controller.gone_pods import GonePods
from reconciler.clock import FakeClock
from reconciler.controller import Request, Result
from reconciler.exec import ExecResult
from reconciler.resources import WatchEvent
from trainer_runtime.contract.jobkinds import JOBSET_JOB_INDEX_LABEL

TJ = d.TRAINJOB
KEY = d.job_key(TJ, NS, JOB)
ENV = [{"name": d.PROGRESS_ENV, "value": "/run/p.json"}]
RUNNING = {"running": {"startedAt": "2026-01-01T10:00:00Z"}}
WAITING = {"waiting": {"reason": "ContainerCreating"}}
GOING = {"deletionTimestamp": "2026-01-01T11:59:30Z"}


def record(step: int, latest: int, reason: str | None = None, **more: Any) -> str:
    ck: dict[str, Any] = {
        "enabled": True,
        "latestCheckpoint": f"/ckpt/checkpoint-{latest}",
        "latestCheckpointTime": "2026-01-01T11:59:40Z",
        "checkpointsCreated": 2,
    }
    if reason:
        ck["latestCheckpointReason"] = reason
    body = {"step": step, "totalSteps": 100, "lastUpdateTime": "2026-01-01T11:59:45Z"}
    return json.dumps({**body, **more, "checkpointing": ck})


def terminated(message: str) -> dict[str, Any]:
    return {"terminated": {"exitCode": 143, "reason": "Error", "message": message}}


def pod(name: str, state: dict[str, Any], created: str, **md: Any) -> dict[str, Any]:
    return _master(TJ, "node", ENV, state, name, created, **md)


def victim(state: dict[str, Any]) -> dict[str, Any]:
    return pod("v", state, "2026-01-01T10:00:00Z", **GOING)


def replacement(state: dict[str, Any]) -> dict[str, Any]:
    return pod("r", state, "2026-01-01T11:59:31Z")


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


MASTER = f"{JOB}-master-0"


def master(uid: str, state: dict[str, Any], created: str, **md: Any) -> dict[str, Any]:
    """A PyTorchJob's master pod: its replacement has the same name, another UID."""
    p = _master(d.PYTORCHJOB, "pytorch", ENV, state, MASTER, created, **md)
    p["metadata"]["uid"] = uid
    return p


# --- the pure choice ---


def test_no_rank0_pod_reads_nothing() -> None:
    assert d.read_order([], TJ) == []
    worker = pod("w", RUNNING, "2026-01-01T10:00:00Z")
    worker["metadata"]["labels"][JOBSET_JOB_INDEX_LABEL] = "1"
    assert d.read_order([worker], TJ) == []


def test_a_running_victim_is_read_before_its_pending_replacement() -> None:
    pods = [replacement(WAITING), victim(RUNNING)]
    assert names(d.read_order(pods, TJ, observed="v")) == ["v", "r"]
    assert d.rank0_pod(pods, TJ) is pods[0]  # the replacement still schedules the job


def test_a_terminated_victim_is_read_by_its_termination_message_before_its_replacement() -> None:
    pods = [victim(terminated(record(45, 45, "jit"))), replacement(WAITING)]
    assert names(d.read_order(pods, TJ, observed="v")) == ["v", "r"]
    # Nothing to read: no message, or a container that never started.
    for state in (terminated(""), WAITING, {}):
        assert names(d.read_order([victim(state), replacement(WAITING)], TJ, "v")) == ["r"]


def test_once_the_replacement_reported_the_victim_is_read_no_more() -> None:
    pods = [victim(terminated(record(45, 45, "jit"))), replacement(RUNNING)]
    assert names(d.read_order(pods, TJ, observed="r")) == ["r"]
    # Running but not reported yet (no record taken from it): the victim first, then it.
    assert names(d.read_order(pods, TJ, observed="v")) == ["v", "r"]
    assert names(d.read_order(pods, TJ, observed=None)) == ["v", "r"]


def test_two_terminating_pods_oldest_first_none_before_the_observed_one() -> None:
    old = pod("v1", RUNNING, "2026-01-01T09:00:00Z", **GOING)
    new = pod("v2", terminated(record(45, 45, "jit")), "2026-01-01T10:00:00Z", **GOING)
    # No replacement yet: the newest being deleted is the rank-0 pod, read last.
    assert names(d.read_order([new, old], TJ, observed="v1")) == ["v1", "v2"]
    assert names(d.read_order([new, old], TJ, observed="v2")) == ["v2"]
    assert names(d.read_order([new, old, replacement(WAITING)], TJ, "v2")) == ["v2", "r"]
    assert names(d.read_order([new, old, replacement(WAITING)], TJ, None)) == ["v1", "v2", "r"]


def test_a_pod_deleted_after_the_rank0_pod_was_made_is_not_read_before_it() -> None:
    older = pod("a", RUNNING, "2026-01-01T10:00:00Z")
    newer_going = pod("b", RUNNING, "2026-01-01T11:00:00Z", **GOING)
    assert names(d.read_order([newer_going, older], TJ, observed=None)) == ["a"]


def test_a_gone_pod_and_its_same_named_replacement_are_told_apart_by_uid() -> None:
    gone = master("uid-a", terminated(record(45, 45, "jit")), "2026-01-01T10:00:00Z", **GOING)
    new = master("uid-b", WAITING, "2026-01-01T11:59:50Z")

    def uids(observed_uid: str | None) -> list[str]:
        order = d.read_order([new, gone], d.PYTORCHJOB, MASTER, observed_uid)
        return [p["metadata"]["uid"] for p in order]

    assert uids("uid-a") == ["uid-a", "uid-b"]  # the record taken last was the gone one's
    assert uids("uid-b") == ["uid-b"]
    # Not known which (a restarted controller), or a UID of neither: the newest of the name,
    # so nothing is read that could come after the replacement's record.
    assert uids(None) == ["uid-b"]
    assert uids("uid-other") == ["uid-b"]


def test_gone_pods_keep_the_last_state_of_rank0_pods_with_a_termination_message() -> None:
    clock = FakeClock()
    gone = GonePods(clock, ttl=60.0)
    jit = terminated(record(45, 45, "jit"))
    removed_at_once = pod("v", jit, "2026-01-01T10:00:00Z")  # grace 0: no deletionTimestamp
    gone.remember(removed_at_once)
    gone.remember(pod("x", RUNNING, "2026-01-01T10:00:00Z", **GOING))  # nothing to read now
    gone.remember(pod("y", terminated(""), "2026-01-01T10:00:00Z", **GOING))
    worker = pod("w", jit, "2026-01-01T10:00:00Z", **GOING)
    worker["metadata"]["labels"][JOBSET_JOB_INDEX_LABEL] = "1"
    gone.remember(worker)
    [kept] = gone.of(KEY, live=set())
    assert kept["metadata"]["name"] == "v"
    assert "deletionTimestamp" in kept["metadata"]  # never taken for a live pod
    assert "deletionTimestamp" not in removed_at_once["metadata"]  # the event's own untouched
    assert gone.of(KEY, live={"uid-v"}) == []  # in the cache after all
    clock.step(61.0)
    assert gone.of(KEY, live=set()) == [] and len(gone) == 0
    gone.remember(removed_at_once)
    gone.forget(KEY)
    assert len(gone) == 0


# --- the controller ---


class Pods:
    """A fake exec serving each pod's progress file, and every exec and status write in order;
    a written status is what the next reconcile finds stored."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self.log: list[tuple[Any, ...]] = []

    async def exec(self, client: Any, ns: str, pod: str, argv: list, **kw: Any) -> ExecResult:
        self.log.append(("exec", pod))
        return ExecResult(stdout=self.files[pod].encode(), exit_code=0)


def controller(fx: Pods, prev: dict[str, Any], kind: d.JobKind = TJ) -> ProgressController:
    ctrl = _controller(True, fx, {"trainer_status": False})  # type: ignore[arg-type]
    from progress_controller.ownership import OwnerFacts

    job = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": JOB, "namespace": NS, "uid": "job-uid", "resourceVersion": "5"},
    }
    jobs = ctrl.jobs if kind is d.PYTORCHJOB else ctrl.trainjobs.informer
    assert jobs is not None
    _load(jobs, job)
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": JOB, "uid": "js"}
    tj = {"apiVersion": TJ.api_version, "kind": TJ.kind, "name": JOB, "uid": "job-uid"}
    ctrl.owners._facts["j"] = (OwnerFacts(True, {**js, "controller": True}), float("inf"))
    ctrl.owners._facts["js"] = (OwnerFacts(True, {**tj, "controller": True}), float("inf"))
    store(ctrl, prev, 9, kind)

    async def write(key: str, job: Any, tp: Any, prev: Any, dec: Any) -> None:
        fx.log.append(("write", copy.deepcopy(dec.status), [e.reason for e in dec.events]))
        store(ctrl, dec.status, int(tp["metadata"]["resourceVersion"]) + 1, kind)

    ctrl._write = write  # type: ignore[method-assign]
    return ctrl


def store(ctrl: ProgressController, status: dict[str, Any], rv: int, kind: d.JobKind) -> None:
    ref = {"apiVersion": kind.api_version, "kind": kind.kind, "name": JOB}
    tp = {
        "apiVersion": TRAINING_PROGRESS.api_version,
        "kind": TRAINING_PROGRESS.kind,
        "metadata": {
            "name": JOB,
            "namespace": NS,
            "uid": "tp-uid",
            "resourceVersion": str(rv),
            "ownerReferences": [{**ref, "uid": "job-uid", "controller": True}],
        },
        "spec": {"jobRef": ref},
        "status": copy.deepcopy(status),
    }
    _load(ctrl.tps, tp)


def owned(p: dict[str, Any]) -> dict[str, Any]:
    """`p` owned as its kind's operator owns it (a PyTorchJob directly, a TrainJob's through a
    batch Job whose JobSet the TrainJob owns: `controller` caches those facts)."""
    p = copy.deepcopy(p)
    if d.PYTORCHJOB.is_rank0(p["metadata"]["labels"]):
        ref = {"apiVersion": d.PYTORCHJOB.api_version, "kind": "PyTorchJob", "name": JOB}
        p["metadata"]["ownerReferences"] = [{**ref, "uid": "job-uid", "controller": True}]
    else:
        ref = {"apiVersion": "batch/v1", "kind": "Job", "name": f"{JOB}-node-0", "uid": "j"}
        p["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
    return p


def put_pods(ctrl: ProgressController, *pods: dict[str, Any]) -> None:
    for key in list(ctrl.pods.store.keys()):
        ctrl.pods.store.delete(key)
    for p in pods:
        _load(ctrl.pods, owned(p))


def reconcile(ctrl: ProgressController, key: str = KEY) -> Result | None:
    async def run() -> Result | None:
        with mock.patch.object(controller_module, "datetime", _FixedNow):
            return await ctrl.reconcile(Request.from_key(key))

    return asyncio.run(run())


def writes(fx: Pods) -> list[tuple[Any, ...]]:
    return [e for e in fx.log if e[0] == "write"]


# The status the victim's periodic records made: step 40, checkpoint-40.
BEFORE = {
    "step": 40,
    "observedPod": "v",
    "source": "exec",
    "lastUpdateTime": "2026-01-01T11:59:00Z",
    "checkpointing": {"enabled": True, "latestCheckpoint": "/ckpt/checkpoint-40"},
}


def test_the_victims_jit_record_in_its_termination_message_makes_the_event() -> None:
    fx = Pods({"r": record(46, 45, "resume", resumedFrom="/ckpt/checkpoint-45")})
    ctrl = controller(fx, BEFORE)
    jit = record(45, 45, "jit")
    put_pods(ctrl, victim(terminated(jit)), replacement(WAITING))
    assert reconcile(ctrl) is None  # nothing runs: pod events bring the job back
    [(_, status, events)] = writes(fx)
    assert events == ["JITCheckpoint"]
    assert status["step"] == 45 and status["observedPod"] == "v"
    assert status["source"] == "terminationMessage"
    assert status["checkpointing"]["latestCheckpoint"] == "/ckpt/checkpoint-45"
    assert not [e for e in fx.log if e[0] == "exec"]
    # Read again (another pod event): the same record, no second Event.
    reconcile(ctrl)
    assert [w[2] for w in writes(fx)[1:]] in ([], [[]])

    # The replacement runs: read after the victim, its record is the one kept; it resumed.
    fx.log.clear()
    put_pods(ctrl, victim(terminated(jit)), replacement(RUNNING))
    reconcile(ctrl)
    assert [e for e in fx.log if e[0] == "exec"] == [("exec", "r")]
    [(_, status, events)] = writes(fx)
    assert events == ["Resumed"]
    assert status["step"] == 46 and status["observedPod"] == "r"


def test_a_victim_is_never_taken_after_its_replacements_record() -> None:
    """The victim's just-in-time save failed: the replacement resumed from an older checkpoint
    at a lower step. Once its record is taken, the victim's (higher) one is not read again."""
    fx = Pods({"r": record(41, 40, "resume", resumedFrom="/ckpt/checkpoint-40")})
    ctrl = controller(fx, BEFORE)
    last = record(47, 40)
    put_pods(ctrl, victim(terminated(last)), replacement(RUNNING))
    reconcile(ctrl)
    [(_, status, events)] = writes(fx)
    assert status["step"] == 41 and status["observedPod"] == "r"
    assert "Resumed" in events
    interruptions = status["lifetime"]["interruptions"]
    for _ in range(2):
        fx.log.clear()
        ctrl._state[KEY].next_poll = 0.0  # due
        reconcile(ctrl)
        assert [e for e in fx.log if e[0] == "exec"] == [("exec", "r")]
        # Not even in between: no interruption counted, no Event.
        for _, status, events in writes(fx):
            assert (status["step"], status["observedPod"]) == (41, "r")
            assert status["lifetime"]["interruptions"] == interruptions and events == []


def test_a_victim_deleted_right_after_its_final_status_is_read_from_its_last_state() -> None:
    """The kubelet deletes the pod in the sync that wrote its termination message: the
    reconcile finds it gone from the cache, and reads the message from the DELETED event's pod."""
    fx = Pods({})
    ctrl = controller(fx, BEFORE)
    final = victim(terminated(record(45, 45, "jit")))
    put_pods(ctrl, final, replacement(WAITING))
    ctrl.pods._apply(WatchEvent("DELETED", owned(final)))
    assert ctrl.pods.store.get(f"{NS}/v") is None
    reconcile(ctrl)
    [(_, status, events)] = writes(fx)
    assert events == ["JITCheckpoint"]
    assert (status["step"], status["observedPod"]) == (45, "v")
    assert status["source"] == "terminationMessage"


def test_a_pytorchjob_masters_final_record_is_read_though_its_replacement_has_its_name() -> None:
    key = d.job_key(d.PYTORCHJOB, NS, JOB)
    fx = Pods({MASTER: record(40, 40, "periodic")})
    ctrl = controller(fx, {}, d.PYTORCHJOB)
    put_pods(ctrl, master("uid-a", RUNNING, "2026-01-01T10:00:00Z"))
    reconcile(ctrl, key)
    assert writes(fx)[-1][1]["step"] == 40
    # Deleted: it exits with its JIT record and goes; the operator makes a master of the same
    # name, Pending.
    final = master("uid-a", terminated(record(45, 45, "jit")), "2026-01-01T10:00:00Z", **GOING)
    ctrl.pods._apply(WatchEvent("DELETED", owned(final)))
    put_pods(ctrl, master("uid-b", WAITING, "2026-01-01T11:59:50Z"))
    fx.log.clear()
    reconcile(ctrl, key)
    [(_, status, events)] = writes(fx)
    assert events == ["JITCheckpoint"] and status["step"] == 45
    assert status["source"] == "terminationMessage"
    # The new master runs, resumed from the JIT checkpoint: Resumed; the old one's record is
    # not taken again, however often the job is read.
    fx.files[MASTER] = record(46, 45, "resume", resumedFrom="/ckpt/checkpoint-45")
    put_pods(ctrl, master("uid-b", RUNNING, "2026-01-01T11:59:50Z"))
    fx.log.clear()
    reconcile(ctrl, key)
    [(_, status, events)] = writes(fx)
    assert events == ["Resumed"] and status["step"] == 46
    assert status["lifetime"]["interruptions"] == 1
    for _ in range(2):
        fx.log.clear()
        ctrl._state[key].next_poll = 0.0
        reconcile(ctrl, key)
        assert [e for e in fx.log if e[0] == "exec"] == [("exec", MASTER)]
        for _, status, events in writes(fx):
            assert status["step"] == 46 and status["lifetime"]["interruptions"] == 1, status
            assert events == []


def test_a_running_victim_is_read_by_exec_and_again_soon() -> None:
    fx = Pods({"v": record(45, 45, "jit")})
    ctrl = controller(fx, BEFORE)
    put_pods(ctrl, victim(RUNNING), replacement(WAITING))
    result = reconcile(ctrl)
    assert fx.log[0] == ("exec", "v")
    [(_, status, events)] = writes(fx)
    assert events == ["JITCheckpoint"] and status["observedPod"] == "v"
    # No pod event tells when it writes its last record: it is read again at the early interval.
    assert result == Result(requeue_after=ctrl.settings.early)
    assert ctrl.job_feeds() == {"push": 0, "poll": 0}  # its rank-0 pod (the replacement) waits


def test_a_victims_failed_read_changes_nothing() -> None:
    fx = Pods({})
    ctrl = controller(fx, BEFORE)

    async def gone(client: Any, ns: str, pod: str, argv: list, **kw: Any) -> ExecResult:
        fx.log.append(("exec", pod))
        return ExecResult(stdout=b"", stderr=b"container not found", exit_code=1)

    ctrl.exec_fn = gone
    put_pods(ctrl, victim(RUNNING), replacement(WAITING))
    reconcile(ctrl)
    assert fx.log[0] == ("exec", "v")
    for _, status, events in writes(fx):
        assert events == []
        assert status["step"] == 40 and status["observedPod"] == "v"
        assert {c["type"]: c["status"] for c in status["conditions"]}.get("Progressing") != (
            "Unknown"
        )


# --- the jobs-by-feed gauge ---


def test_every_return_leaves_the_running_flag_right() -> None:
    fx = Pods({"r": record(46, 45)})
    ctrl = controller(fx, BEFORE)
    put_pods(ctrl, replacement(RUNNING))
    reconcile(ctrl)
    assert ctrl._state[KEY].running
    assert ctrl.job_feeds() == {"push": 0, "poll": 1}
    # Not due: the early return keeps it running.
    reconcile(ctrl)
    assert ctrl.job_feeds() == {"push": 0, "poll": 1}
    # Its pods went (an early return before any read): no longer counted.
    put_pods(ctrl)
    assert reconcile(ctrl) is None
    assert ctrl.job_feeds() == {"push": 0, "poll": 0}
    # The TrainingProgress of a same-named predecessor still there: the other early return.
    ctrl._state[KEY] = _JobState(first_seen=0.0, running=True)
    put_pods(ctrl, replacement(RUNNING))
    tp = ctrl.tps.store.get(f"{NS}/{JOB}")
    assert tp is not None
    tp["metadata"]["ownerReferences"][0]["uid"] = "a-deleted-job"
    ctrl._written.clear()
    assert reconcile(ctrl) == Result(requeue_after=2.0)
    assert ctrl.job_feeds() == {"push": 0, "poll": 0}
