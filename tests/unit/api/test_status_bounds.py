"""Sane bounds on what a progress record reports (kubeckpt_api.status_bounds): whatever the values,
`check` never raises, keeps only values in range and names every value it left out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeckpt_api import status_bounds as b

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
CREATED = NOW - timedelta(hours=2)


def rfc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


SOUND: dict[str, Any] = {
    "step": 150,
    "totalSteps": 300,
    "epoch": 1,
    "percentComplete": "50.0",
    "estimatedTimeRemaining": "45m",
    "stepSeconds": "1.82",
    "lastUpdateTime": rfc(NOW - timedelta(seconds=10)),
    "checkpointing": {
        "enabled": True,
        "latestCheckpoint": "/mnt/kubeckpt/ns/job/checkpoint-150",
        "checkpointsCreated": 3,
        "latestCheckpointTime": rfc(NOW - timedelta(minutes=5)),
        "lastSaveSeconds": "2.1",
        "lastStallSeconds": "0.08",
    },
}


def test_a_sound_record_is_kept_whole() -> None:
    fields, problems = b.check(SOUND, now=NOW, job_created=CREATED)
    assert fields == SOUND and problems == []


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        (("stepSeconds",), "1e300", "outside 0..3600"),
        (("stepSeconds",), "3600.5", "outside 0..3600"),
        (("percentComplete",), "250", "outside 0..100"),
        (("checkpointing", "lastSaveSeconds"), "1e308", "outside 0..86400"),
        (("checkpointing", "lastStallSeconds"), "86401", "outside 0..86400"),
        (("estimatedTimeRemaining",), "99999999h", "outside 0.."),
        (("estimatedTimeRemaining",), "1e12", "outside 0.."),
        (("estimatedTimeRemaining",), "-5m", "outside 0.."),
        (("totalSteps",), 2**53, "outside 0.."),
        (("checkpointing", "checkpointsCreated"), 2**63 - 1, "outside 0.."),
        (("lastUpdateTime",), "2999-01-01T00:00:00Z", "in the future"),
        (("checkpointing", "latestCheckpointTime"), "2999-01-01T00:00:00Z", "in the future"),
        (
            ("checkpointing", "latestCheckpointTime"),
            "2020-01-01T00:00:00Z",
            "before the job was created",
        ),
        (("checkpointing", "latestCheckpointTime"), "yesterday", "not an RFC 3339 time"),
        (("checkpointing", "latestCheckpoint"), f"/c/checkpoint-{2**60}", "names a step"),
    ],
)
def test_a_value_out_of_range_is_left_out_and_named(path: tuple, value: object, why: str) -> None:
    record = _with(SOUND, path, value)
    fields, problems = b.check(record, now=NOW, job_created=CREATED)
    assert [p.field for p in problems] == [".".join(path)], problems
    assert why in problems[0].why and why in problems[0].message()
    assert fields == _without(SOUND, path)


def test_within_the_clock_skew_a_time_is_believed() -> None:
    ahead = rfc(NOW + b.CLOCK_SKEW - timedelta(seconds=1))
    before = rfc(CREATED - b.CLOCK_SKEW + timedelta(seconds=1))
    record = _with(
        _with(SOUND, ("lastUpdateTime",), ahead), ("checkpointing", "latestCheckpointTime"), before
    )
    assert b.check(record, now=NOW, job_created=CREATED) == (record, [])
    # Without the job's creation time there is no lower bound.
    old = _with(SOUND, ("checkpointing", "latestCheckpointTime"), "2001-01-01T00:00:00Z")
    assert b.check(old, now=NOW) == (old, [])


def test_a_checkpoint_resumed_from_may_predate_the_job_but_is_not_used() -> None:
    """A job re-created under the same name resumes from its predecessor's checkpoint: its time
    is true, yet the job lost nothing before it existed. Left out, quietly."""
    ck = dict(SOUND["checkpointing"], latestCheckpointTime="2020-01-01T00:00:00Z")
    ck["latestCheckpointReason"] = "resume"
    fields, problems = b.check(dict(SOUND, checkpointing=ck), now=NOW, job_created=CREATED)
    assert problems == []
    assert "latestCheckpointTime" not in fields["checkpointing"]
    # A time in the future is still refused aloud, resume or not.
    ck["latestCheckpointTime"] = "2999-01-01T00:00:00Z"
    _, problems = b.check(dict(SOUND, checkpointing=ck), now=NOW, job_created=CREATED)
    assert [p.why for p in problems] == ["is in the future"]


def test_free_text_eta_is_kept_and_unknown() -> None:
    fields, problems = b.check(dict(SOUND, estimatedTimeRemaining="soon"), now=NOW)
    assert fields["estimatedTimeRemaining"] == "soon" and problems == []
    assert b.eta_seconds("soon") is None and b.eta_seconds("45m") == 2700
    assert b.eta_seconds("1e400") is None and b.eta_seconds(None) is None


def test_step_seconds_accessor() -> None:
    assert b.step_seconds("1.5") == 1.5
    assert b.step_seconds("0") is None  # not measured yet
    for hostile in ("1e300", "-1", "nan", "inf", "", None, True, "9" * 100, 1e300):
        assert b.step_seconds(hostile) is None, hostile


NUMBERS = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**53 - 1, 2**53, 2**63, -1, 0]),
)
DECIMALS = st.one_of(
    NUMBERS.map(str),
    st.text(max_size=30),
    st.sampled_from(["1e308", "1e309", "-0", ".5", "3600", "3600.0001", "100", "100.01"]),
)
TIMES = st.one_of(
    st.datetimes(
        min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ).map(rfc),
    st.text(max_size=30),
)
VALUES = st.one_of(NUMBERS, DECIMALS, TIMES, st.none(), st.booleans())


@settings(max_examples=400, deadline=None)
@given(
    top=st.dictionaries(
        st.sampled_from(
            [
                "step",
                "totalSteps",
                "epoch",
                "percentComplete",
                "stepSeconds",
                "lastUpdateTime",
                "estimatedTimeRemaining",
                "loss",
            ]
        ),
        VALUES,
    ),
    ck=st.dictionaries(
        st.sampled_from(
            [
                "checkpointsCreated",
                "failedSaves",
                "lastSaveSeconds",
                "lastStallSeconds",
                "latestCheckpointTime",
                "latestCheckpoint",
                "latestCheckpointReason",
            ]
        ),
        VALUES,
    ),
    created=st.one_of(st.none(), st.just(CREATED)),
)
def test_hostile_values_never_raise_and_only_values_in_range_stay(
    top: dict, ck: dict, created: datetime | None
) -> None:
    record = dict(top, checkpointing=ck)
    fields, problems = b.check(record, now=NOW, job_created=created)
    kept_ck = fields.get("checkpointing") or {}
    for path, (low, high) in b.DECIMAL_RANGES.items():
        value = _get(fields, path)
        if value is not None:
            number = float(value)
            assert low <= number <= high, (path, value)
    for path in b.COUNT_FIELDS:
        value = _get(fields, path)
        if value is not None:
            assert isinstance(value, int) and 0 <= value <= b.MAX_COUNT, (path, value)
    for path in b.TIME_FIELDS:
        value = _get(fields, path)
        if value is not None:
            from trainer_runtime.contract.progress import parse_rfc3339

            assert parse_rfc3339(value) <= NOW + b.CLOCK_SKEW
            if created is not None:
                assert parse_rfc3339(value) >= created - b.CLOCK_SKEW
    eta = fields.get("estimatedTimeRemaining")
    seconds = b.eta_seconds(eta)
    assert seconds is None or 0 <= seconds <= b.MAX_ETA_SECONDS
    # Everything left out was named (but a resumed-from checkpoint's time before the job).
    named = {p.field for p in problems}
    for key in top:
        if key not in fields:
            assert key in named, (key, top[key])
    for key in ck:
        if key not in kept_ck and not (
            key == "latestCheckpointTime" and ck.get("latestCheckpointReason") == "resume"
        ):
            assert f"checkpointing.{key}" in named, (key, ck[key])
    assert fields.get("loss") is top.get("loss")  # sizes nothing: not bounded here


def _get(fields: dict, path: tuple) -> Any:
    value: Any = fields
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _with(record: dict, path: tuple, value: object) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in record.items()}
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


def _without(record: dict, path: tuple) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in record.items()}
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return out
