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
from reconciler.controller import Request, Result
from reconciler.exec import ExecResult
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


def controller(fx: Pods, prev: dict[str, Any]) -> ProgressController:
    ctrl = _controller(True, fx, {"trainer_status": False})  # type: ignore[arg-type]
    from progress_controller.ownership import OwnerFacts

    job = {
        "apiVersion": TJ.api_version,
        "kind": TJ.kind,
        "metadata": {"name": JOB, "namespace": NS, "uid": "job-uid", "resourceVersion": "5"},
    }
    assert ctrl.trainjobs.informer is not None
    _load(ctrl.trainjobs.informer, job)
    js = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": JOB, "uid": "js"}
    tj = {"apiVersion": TJ.api_version, "kind": TJ.kind, "name": JOB, "uid": "job-uid"}
    ctrl.owners._facts["j"] = (OwnerFacts(True, {**js, "controller": True}), float("inf"))
    ctrl.owners._facts["js"] = (OwnerFacts(True, {**tj, "controller": True}), float("inf"))
    store(ctrl, prev, 9)

    async def write(key: str, job: Any, tp: Any, prev: Any, dec: Any) -> None:
        fx.log.append(("write", copy.deepcopy(dec.status), [e.reason for e in dec.events]))
        store(ctrl, dec.status, int(tp["metadata"]["resourceVersion"]) + 1)

    ctrl._write = write  # type: ignore[method-assign]
    return ctrl


def store(ctrl: ProgressController, status: dict[str, Any], rv: int) -> None:
    ref = {"apiVersion": TJ.api_version, "kind": TJ.kind, "name": JOB}
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


def put_pods(ctrl: ProgressController, *pods: dict[str, Any]) -> None:
    for key in list(ctrl.pods.store.keys()):
        ctrl.pods.store.delete(key)
    for p in pods:
        p = copy.deepcopy(p)
        ref = {"apiVersion": "batch/v1", "kind": "Job", "name": f"{JOB}-node-0", "uid": "j"}
        p["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
        _load(ctrl.pods, p)


def reconcile(ctrl: ProgressController) -> Result | None:
    async def run() -> Result | None:
        with mock.patch.object(controller_module, "datetime", _FixedNow):
            return await ctrl.reconcile(Request.from_key(KEY))

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
    fx.log.clear()
    ctrl._state[KEY].next_poll = 0.0  # due
    reconcile(ctrl)
    assert [e for e in fx.log if e[0] == "exec"] == [("exec", "r")]
    assert all(w[1]["step"] == 41 and w[1]["observedPod"] == "r" for w in writes(fx))


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
