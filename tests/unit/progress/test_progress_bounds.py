"""Numbers from a progress record are checked against status_bounds before they size anything:
the poll interval and the stall window (a huge stepSeconds used to stop polling and Stalled for
good), the TrainJob trainerStatus, the pods' last-checkpoint annotations. Out of range is the
ValuesInRange condition (the field named), never an exception, and the value is not used."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubeckpt_api import status_bounds as b
from kubeckpt_api.status import condition
from progress_controller.decide import Observation, decide
from progress_controller.lastcheckpoint import wanted
from progress_controller.schedule import PollSettings, poll_interval, stall_after, update_period
from progress_controller.trainjob import trainer_status
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION,
    LAST_CHECKPOINT_TIME_ANNOTATION,
)
from trainer_runtime.contract.progress import parse_progress, parse_rfc3339

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
CREATED = NOW - timedelta(hours=1)
S = PollSettings(jitter=0.0)


def rfc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def rec(step: int = 10, **kw: Any):
    data: dict[str, Any] = {
        "step": step,
        "totalSteps": 100,
        "stepSeconds": "1.5",
        "lastUpdateTime": rfc(NOW - timedelta(seconds=5)),
    }
    data.update(kw)
    return parse_progress(json.dumps({k: v for k, v in data.items() if v is not None}))


def observe(record: Any, **kw: Any) -> Observation:
    return Observation(pod="job-master-0", record=record, source="exec", job_created=CREATED, **kw)


def in_range(status: dict) -> dict:
    c = condition(status.get("conditions") or [], "ValuesInRange")
    assert c is not None, status
    return c


def test_huge_step_and_save_seconds_are_left_out_and_named() -> None:
    ck = {"enabled": True, "latestCheckpoint": "/c/checkpoint-10", "lastSaveSeconds": "1e300"}
    dec = decide({}, observe(rec(stepSeconds="1e300", checkpointing=ck)), NOW)
    st_ = dec.status
    assert dec.accepted and st_["step"] == 10  # the rest of the record is taken
    assert "stepSeconds" not in st_ and "lastSaveSeconds" not in st_["checkpointing"]
    c = in_range(st_)
    assert (c["status"], c["reason"]) == ("False", "ValueOutOfRange")
    assert "stepSeconds 1e300" in c["message"]
    assert "checkpointing.lastSaveSeconds 1e300" in c["message"]
    assert condition(st_["conditions"], "Progressing")["status"] == "True"  # type: ignore[index]
    # The same record again: no change to write.
    again = decide(st_, observe(rec(stepSeconds="1e300", checkpointing=ck)), NOW)
    assert again.status["conditions"] == st_["conditions"]
    # A sound record clears it.
    fixed = decide(st_, observe(rec(step=11)), NOW + timedelta(seconds=30)).status
    c = in_range(fixed)
    assert (c["status"], c["reason"]) == ("True", "ValuesInRange")
    assert fixed["stepSeconds"] == "1.5"


def test_a_sound_record_sets_no_range_condition() -> None:
    status = decide({}, observe(rec()), NOW).status
    assert condition(status["conditions"], "ValuesInRange") is None


def test_polling_and_stall_stay_bounded_whatever_the_pod_claims() -> None:
    """Before: stepSeconds 1e300 x frequency made the next poll centuries away and Stalled
    never. A value out of range sizes nothing; the pod's frequency cannot stretch a sound one
    beyond MAX_UPDATE_PERIOD."""
    assert update_period(b.step_seconds("1e300"), 5) is None
    assert poll_interval(S, has_record=True, age=1e6, since_change=None, period=None) == S.stale
    assert stall_after(S, None) == S.stall_floor
    period = update_period(b.step_seconds("3600"), 10**9)
    assert period == b.MAX_UPDATE_PERIOD
    assert poll_interval(S, has_record=True, age=1e6, since_change=None, period=period) <= 3600
    assert stall_after(S, period) == 3 * b.MAX_UPDATE_PERIOD
    assert update_period(20.0, 5) == 100  # sound values as before


def test_a_future_last_update_time_cannot_keep_a_job_from_stalling() -> None:
    """lastUpdateTime far ahead made the age negative: Stalled never came. Not believed, it is
    replaced by when this controller saw the step change."""
    future = rfc(NOW + timedelta(days=3650))
    first = decide({}, observe(rec(lastUpdateTime=future), stall_after=60), NOW).status
    assert first["lastUpdateTime"] == rfc(NOW)
    assert "lastUpdateTime" in in_range(first)["message"]
    later = NOW + timedelta(minutes=5)
    stuck = decide(first, observe(rec(lastUpdateTime=future), stall_after=60), later)
    assert stuck.status["lastUpdateTime"] == rfc(NOW)  # same step: when it last changed
    stalled = condition(stuck.status["conditions"], "Stalled")
    assert stalled is not None and stalled["status"] == "True"
    assert [e.reason for e in stuck.events] == ["Stalled"]


def test_a_checkpoint_time_in_the_future_or_before_the_job_is_not_put_on_pods() -> None:
    for when in (NOW + timedelta(days=1), CREATED - timedelta(days=30)):
        ck = {
            "enabled": True,
            "latestCheckpoint": "/c/checkpoint-8",
            "latestCheckpointTime": rfc(when),
        }
        status = decide({}, observe(rec(checkpointing=ck)), NOW).status
        assert "latestCheckpointTime" not in status["checkpointing"]
        assert "checkpointing.latestCheckpointTime" in in_range(status)["message"]
        assert wanted(status) == {LAST_CHECKPOINT_STEP_ANNOTATION: "8"}
    sound = {
        "enabled": True,
        "latestCheckpoint": "/c/checkpoint-8",
        "latestCheckpointTime": rfc(NOW),
    }
    status = decide({}, observe(rec(checkpointing=sound)), NOW).status
    assert wanted(status) == {
        LAST_CHECKPOINT_STEP_ANNOTATION: "8",
        LAST_CHECKPOINT_TIME_ANNOTATION: rfc(NOW),
    }


def test_a_step_out_of_range_refuses_the_record_and_keeps_the_last_good_values() -> None:
    good = decide({}, observe(rec(step=10)), NOW).status
    dec = decide(good, observe(rec(step=2**60)), NOW + timedelta(seconds=30))
    assert not dec.accepted and dec.status["step"] == 10
    p = condition(dec.status["conditions"], "Progressing")
    assert p is not None and (p["status"], p["reason"]) == ("Unknown", "ValueOutOfRange")
    assert "step" in p["message"]


def test_trainer_status_takes_only_an_eta_in_range() -> None:
    ts = trainer_status({"step": 1, "estimatedTimeRemaining": "99999999h"})
    assert ts is not None and "estimatedRemainingSeconds" not in ts
    ts = trainer_status({"step": 1, "estimatedTimeRemaining": "45m"})
    assert ts is not None and ts["estimatedRemainingSeconds"] == 2700


DECIMAL_TEXT = st.one_of(
    st.floats(min_value=0, allow_nan=False, allow_infinity=False).map(repr),
    st.integers(0, 10**30).map(str),
    st.sampled_from(["1e308", "3600", "3600.1", "100.5", "0", "86400", "86400.5"]),
)
TIMES = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)
).map(rfc)
COUNTS = st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([2**53 - 1, 2**53, 2**63 - 1]))


@settings(max_examples=300, deadline=None)
@given(
    step=COUNTS,
    step_seconds=DECIMAL_TEXT,
    percent=DECIMAL_TEXT,
    save=DECIMAL_TEXT,
    stall=DECIMAL_TEXT,
    updated=TIMES,
    ck_time=TIMES,
    ck_step=COUNTS,
    ck_count=COUNTS,
    frequency=st.integers(1, 10**12),
)
def test_whatever_a_record_says_the_status_and_the_schedule_stay_in_range(
    step: int,
    step_seconds: str,
    percent: str,
    save: str,
    stall: str,
    updated: str,
    ck_time: str,
    ck_step: int,
    ck_count: int,
    frequency: int,
) -> None:
    ck = {
        "enabled": True,
        "latestCheckpoint": f"/c/checkpoint-{ck_step}",
        "latestCheckpointTime": ck_time,
        "lastSaveSeconds": save,
        "lastStallSeconds": stall,
        "checkpointsCreated": ck_count,
    }
    record = rec(
        step,
        stepSeconds=step_seconds,
        percentComplete=percent,
        lastUpdateTime=updated,
        checkpointing=ck,
    )
    dec = decide({}, observe(record, stall_after=60), NOW)
    status = dec.status
    for path, (low, high) in b.DECIMAL_RANGES.items():
        value: Any = status
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        assert value is None or low <= float(value) <= high, (path, value)
    for key in ("step", "totalSteps"):
        assert status.get(key) is None or 0 <= status[key] <= b.MAX_COUNT
    ckpt = status.get("checkpointing") or {}
    assert ckpt.get("checkpointsCreated") is None or ckpt["checkpointsCreated"] <= b.MAX_COUNT
    for when in (status.get("lastUpdateTime"), ckpt.get("latestCheckpointTime")):
        if when is not None:
            assert CREATED - b.CLOCK_SKEW <= parse_rfc3339(when) <= NOW + b.CLOCK_SKEW
    annotations = wanted(status) or {}
    if LAST_CHECKPOINT_STEP_ANNOTATION in annotations:
        assert int(annotations[LAST_CHECKPOINT_STEP_ANNOTATION]) <= b.MAX_COUNT
    period = update_period(b.step_seconds(status.get("stepSeconds")), frequency)
    assert period is None or 0 < period <= b.MAX_UPDATE_PERIOD
    interval = poll_interval(S, has_record=True, age=1e9, since_change=1e9, period=period)
    assert interval <= max(S.stale, b.MAX_UPDATE_PERIOD)
    assert stall_after(S, period) <= max(S.stall_floor, S.stall_periods * b.MAX_UPDATE_PERIOD)
    ts = trainer_status(status)
    if ts is not None:
        assert 0 <= ts.get("progressPercentage", 0) <= 100
        assert 0 <= ts.get("estimatedRemainingSeconds", 0) <= b.MAX_ETA_SECONDS
