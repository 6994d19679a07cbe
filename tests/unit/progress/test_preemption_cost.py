"""The preemption cost -> Kueue priority boost: bounded, monotone in the work a preemption would
lose, the same for the same inputs, and nothing at all from values out of range."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubeckpt_api import status_bounds as bounds
from progress_controller.preemption_cost import (
    INT32_MAX,
    CostSettings,
    CostSettingsError,
    JobProgress,
    boost_for_cost,
    boost_value,
    cost_seconds,
    priority_boost,
    progress_from_status,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
STARTED = NOW - timedelta(days=2)

settings_st = st.builds(
    CostSettings,
    max_boost=st.integers(1, INT32_MAX),
    horizon_seconds=st.floats(120, 10 * 86400),
    unit_seconds=st.floats(1, 60),
)
steps = st.integers(0, 10**7)
step_secs = st.one_of(st.none(), st.floats(0.001, bounds.MAX_STEP_SECONDS))
save_secs = st.one_of(st.none(), st.floats(0, bounds.MAX_SAVE_SECONDS))
ages = st.floats(0, 30 * 86400)


def running(**kw) -> JobProgress:
    base = dict(state="Training", now=NOW, started=STARTED)
    base.update(kw)
    return JobProgress(**base)


@given(
    settings_st,
    st.sampled_from(["Training", "Stalled", "Pending", "Suspended"]),
    steps,
    steps,
    step_secs,
    save_secs,
    ages,
)
def test_boost_is_within_zero_and_max(s, state, a, b, step_seconds, save, age):
    p = running(
        state=state,
        step=max(a, b),
        checkpoint_step=min(a, b),
        checkpoint_time=NOW - timedelta(seconds=age),
        step_seconds=step_seconds,
        save_seconds=save,
    )
    boost = priority_boost(p, s)
    assert boost is not None and 0 <= boost <= s.max_boost
    assert int(boost_value(boost)) == boost


@given(settings_st, steps, steps, steps, st.floats(0.001, bounds.MAX_STEP_SECONDS), save_secs)
def test_more_steps_since_the_checkpoint_never_lowers_the_boost(s, ck, more, extra, sec, save):
    fewer = running(step=ck + more, checkpoint_step=ck, step_seconds=sec, save_seconds=save)
    lots = running(step=ck + more + extra, checkpoint_step=ck, step_seconds=sec, save_seconds=save)
    assert priority_boost(fewer, s) <= priority_boost(lots, s)


@given(settings_st, steps, ages, ages, save_secs)
def test_an_older_checkpoint_never_lowers_the_boost(s, ck, age, older, save):
    # Without a measured step time the wall time since the checkpoint is the lost work.
    young = running(step=ck, checkpoint_step=ck, checkpoint_time=NOW - timedelta(seconds=age))
    old = running(step=ck, checkpoint_step=ck, checkpoint_time=NOW - timedelta(seconds=age + older))
    assert priority_boost(young, s) <= priority_boost(old, s)


@given(settings_st, steps, steps, st.floats(0.001, 3600), save_secs, save_secs)
def test_a_slower_save_never_lowers_the_boost(s, ck, more, sec, save, slower):
    fast = running(step=ck + more, checkpoint_step=ck, step_seconds=sec, save_seconds=save)
    slow = running(
        step=ck + more,
        checkpoint_step=ck,
        step_seconds=sec,
        save_seconds=(save or 0) + (slower or 0),
    )
    assert priority_boost(fast, s) <= priority_boost(slow, s)


@given(settings_st, st.floats(0, 10 * 86400), st.floats(0, 10 * 86400))
def test_boost_for_cost_is_monotone(s, a, b):
    low, high = sorted((a, b))
    assert boost_for_cost(low, s) <= boost_for_cost(high, s)


@given(settings_st, steps, steps, step_secs, save_secs, st.floats(0, 86400))
def test_same_inputs_same_value(s, ck, more, sec, save, age):
    status = {
        "state": "Training",
        "step": ck + more,
        "checkpointing": {
            "latestCheckpoint": f"checkpoint-{ck}",
            "latestCheckpointTime": (NOW - timedelta(seconds=int(age))).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
        },
    }
    if sec is not None:
        status["stepSeconds"] = f"{sec:.3f}" if sec >= 0.001 else "0.001"
    if save is not None:
        status["checkpointing"]["lastSaveSeconds"] = f"{save:.3f}"
    first = progress_from_status(status, now=NOW, started=STARTED)
    assert first is not None
    second = progress_from_status(dict(status), now=NOW, started=STARTED)
    assert first == second
    assert priority_boost(first, s) == priority_boost(second, s)


def test_just_checkpointed_is_cheap_and_long_since_is_expensive():
    s = CostSettings()
    just = running(step=500, checkpoint_step=500, step_seconds=2.0, save_seconds=0.0)
    assert priority_boost(just, s) == 0
    day = running(step=500 + 43200, checkpoint_step=500, step_seconds=2.0, save_seconds=30.0)
    assert priority_boost(day, s) == s.max_boost
    hour = running(step=500 + 1800, checkpoint_step=500, step_seconds=2.0, save_seconds=30.0)
    assert 0 < priority_boost(hour, s) < s.max_boost


def test_the_save_time_is_part_of_the_cost():
    p = running(step=100, checkpoint_step=100, step_seconds=1.0, save_seconds=600.0)
    assert cost_seconds(p) == 600.0
    assert priority_boost(p) > 0


def test_no_checkpoint_yet_counts_the_work_since_start():
    with_steps = running(step=3600, step_seconds=1.0)
    assert cost_seconds(with_steps) == 3600.0
    # Without a step time: the wall time since the job started.
    by_clock = running(step=3600, started=NOW - timedelta(hours=1))
    assert cost_seconds(by_clock) == 3600.0
    assert priority_boost(by_clock) == priority_boost(with_steps)


def test_a_resumed_job_counts_steps_not_the_time_it_spent_suspended():
    # The checkpoint was written two days ago; the job was suspended since and resumed ten
    # steps ago: it loses ten steps, not two days.
    p = running(
        step=110,
        checkpoint_step=100,
        checkpoint_time=NOW - timedelta(days=2),
        step_seconds=1.0,
    )
    assert cost_seconds(p) == 10.0


@pytest.mark.parametrize("state", ["Pending", "Suspended"])
def test_a_job_that_is_not_running_has_nothing_to_lose(state):
    p = running(state=state, step=100_000, checkpoint_step=0, step_seconds=10.0)
    assert priority_boost(p) == 0


@pytest.mark.parametrize("state", ["Succeeded", "Failed", "Unknown", "Whatever"])
def test_a_finished_or_unknown_job_gets_no_write(state):
    assert priority_boost(running(state=state, step=10, step_seconds=1.0)) is None


def test_unknown_lost_work_gets_no_write():
    # A checkpoint without a time and no step time: nothing to measure by.
    assert priority_boost(running(step=10, checkpoint_step=5, started=None)) is None
    # A status that contradicts itself (step before its checkpoint).
    assert priority_boost(running(step=10, checkpoint_step=50, step_seconds=1.0)) is None


def _status(**over):
    status = {
        "state": "Training",
        "step": 200,
        "stepSeconds": "1.5",
        "checkpointing": {
            "latestCheckpoint": "checkpoint-100",
            "latestCheckpointTime": "2026-01-01T11:00:00Z",
            "lastSaveSeconds": "12.5",
        },
    }
    for key, value in over.items():
        if key in status["checkpointing"]:
            status["checkpointing"][key] = value
        else:
            status[key] = value
    return status


def test_progress_from_a_status():
    p = progress_from_status(_status(), now=NOW, started=STARTED)
    assert p == JobProgress(
        state="Training",
        now=NOW,
        started=STARTED,
        step=200,
        checkpoint_step=100,
        checkpoint_time=datetime(2026, 1, 1, 11, 0, tzinfo=UTC),
        step_seconds=1.5,
        save_seconds=12.5,
    )
    assert cost_seconds(p) == 100 * 1.5 + 12.5


def test_a_generation_checkpoint_names_its_step():
    status = _status(latestCheckpoint="generation-2/checkpoint-150")
    assert progress_from_status(status, now=NOW, started=STARTED).checkpoint_step == 150


@pytest.mark.parametrize(
    "over",
    [
        {"stepSeconds": "7200"},  # over MAX_STEP_SECONDS
        {"stepSeconds": "-1"},
        {"stepSeconds": "nan"},
        {"lastSaveSeconds": str(bounds.MAX_SAVE_SECONDS * 2)},
        {"latestCheckpointTime": "2026-01-01T13:00:00Z"},  # an hour in the future
        {"latestCheckpointTime": "not a time"},
        {"step": bounds.MAX_COUNT + 1},
        {"step": -5},
        {"latestCheckpoint": f"checkpoint-{bounds.MAX_COUNT + 1}"},
        {"latestCheckpoint": "not-a-checkpoint"},
        {"state": None},
    ],
)
def test_values_out_of_range_mean_no_write(over):
    assert progress_from_status(_status(**over), now=NOW, started=STARTED) is None


def test_a_checkpoint_from_before_the_job_means_no_write_unless_it_was_resumed():
    old = _status(latestCheckpointTime="2025-12-01T00:00:00Z")
    assert progress_from_status(old, now=NOW, started=STARTED) is None
    old["checkpointing"]["latestCheckpointReason"] = "resume"
    assert progress_from_status(old, now=NOW, started=STARTED) is not None


def test_an_unmeasured_step_time_falls_back_to_the_clock():
    status = _status(stepSeconds="0")
    p = progress_from_status(status, now=NOW, started=STARTED)
    assert p.step_seconds is None
    assert cost_seconds(p) == 3600.0 + 12.5


@pytest.mark.parametrize(
    "kw",
    [
        {"max_boost": 0},
        {"max_boost": INT32_MAX + 1},
        {"max_boost": True},
        {"max_boost": 1.5},
        {"horizon_seconds": 0},
        {"unit_seconds": float("inf")},
        {"unit_seconds": 100.0, "horizon_seconds": 50.0},
    ],
)
def test_settings_that_cannot_bound_the_boost_are_refused(kw):
    with pytest.raises(CostSettingsError):
        CostSettings(**kw)


def test_boost_value_is_an_int32():
    assert boost_value(0) == "0"
    assert boost_value(INT32_MAX) == str(INT32_MAX)
    with pytest.raises(ValueError):
        boost_value(INT32_MAX + 1)
