"""A save that fails (the stop's JIT save among them): the TrainingProgress says so with one
CheckpointFailed Event naming the step, the runtime's reason and where the next resume comes from;
then the resume from the older periodic checkpoint says what it lost (issue 25's failed-JIT test,
at the decision's level; tests/integration/progress/test_progress_failed_jit.py on a cluster)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from progress_controller.decide import Decision, Observation, decide
from trainer_runtime.contract.progress import format_rfc3339, parse_progress

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def record(step: int, at: datetime, incarnation: str, **ck: Any) -> Any:
    data: dict[str, Any] = {
        "step": step,
        "stepSeconds": "1.000",
        "lastUpdateTime": format_rfc3339(at),
        "incarnation": incarnation,
        "checkpointing": {"enabled": True, **ck},
    }
    if incarnation == "b":
        data["resumedFrom"] = "/c/checkpoint-40"
    return parse_progress(json.dumps(data))


def read(status: dict, rec: Any, pod: str, at: datetime, source: str = "exec") -> Decision:
    obs = Observation(pod=pod, record=rec, source=source, job_created=T0 - timedelta(hours=1))
    return decide(status, obs, at)


def failed(d: Decision) -> list[str]:
    return [e.message for e in d.events if e.reason == "CheckpointFailed"]


PERIODIC = {"checkpointsCreated": 4, "latestCheckpoint": "/c/checkpoint-40"}
FAILED_STOP = {
    **PERIODIC,
    "failedSaves": 1,
    "lastError": "just-in-time save failed: [Errno 28] No space left on device",
    "lastFailedStep": 47,
}


def test_a_failed_jit_save_is_said_once_and_the_resume_names_what_it_lost() -> None:
    st = read({}, record(45, T0, "a", **PERIODIC), "m-0", T0).status
    d = read(st, record(47, T0 + timedelta(seconds=2), "a", **FAILED_STOP), "m-0", T0)
    (msg,) = failed(d)
    assert d.events[-1].type == "Warning"
    assert "at step 47" in msg and "No space left on device" in msg, msg
    assert "a resume comes from /c/checkpoint-40" in msg, msg
    assert d.status["checkpointing"]["lastError"].startswith("just-in-time save failed")
    # The same record again, and the same process's final record from the termination message:
    # nothing new failed, nothing said again.
    again = read(d.status, record(47, T0 + timedelta(seconds=3), "a", **FAILED_STOP), "m-0", T0)
    assert failed(again) == []
    final = read(again.status, record(47, T0, "a", **FAILED_STOP), "m-0", T0, "terminationMessage")
    assert failed(final) == []
    # The replacement resumes from the periodic checkpoint: the Resumed Event counts the loss.
    resumed = read(
        final.status,
        record(40, T0 + timedelta(seconds=30), "b", checkpointsCreated=0),
        "m-0",
        T0 + timedelta(seconds=30),
    )
    (res,) = [e.message for e in resumed.events if e.reason == "Resumed"]
    assert "resumed from /c/checkpoint-40" in res and "7 steps lost" in res, res
    assert resumed.status["lifetime"]["lastInterruption"]["stepsLost"] == 7
    assert failed(resumed) == []


def test_a_second_failure_in_the_same_process_is_said_again() -> None:
    st = read({}, record(47, T0, "a", **FAILED_STOP), "m-0", T0)
    assert len(failed(st)) == 1  # first seen already failed: said
    twice = {**FAILED_STOP, "failedSaves": 2, "lastFailedStep": 60}
    d = read(st.status, record(60, T0 + timedelta(seconds=13), "a", **twice), "m-0", T0)
    (msg,) = failed(d)
    assert "at step 60" in msg, msg


def test_a_new_process_with_its_own_failure_is_said_and_an_old_count_is_not() -> None:
    st = read({}, record(47, T0, "a", **FAILED_STOP), "m-0", T0).status
    clean = record(41, T0 + timedelta(seconds=30), "b", **PERIODIC)
    assert failed(read(st, clean, "m-0", T0 + timedelta(seconds=30))) == []
    own = record(41, T0 + timedelta(seconds=30), "b", **{**FAILED_STOP, "lastFailedStep": 41})
    (msg,) = failed(read(st, own, "m-0", T0 + timedelta(seconds=30)))
    assert "at step 41" in msg, msg


def test_a_hostile_reason_is_escaped_and_bounded() -> None:
    hostile = {**FAILED_STOP, "lastError": "\x1b[2J\u202eboom " + "x" * 900}
    (msg,) = failed(read({}, record(47, T0, "a", **hostile), "m-0", T0))
    assert "\x1b" not in msg and "\u202e" not in msg and len(msg) <= 1024 and "\\x1b" in msg, msg
