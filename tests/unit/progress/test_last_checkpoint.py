"""The last-checkpoint annotations (checkpoint-aware preemption): what a pod should carry, from the
TrainingProgress status and the pod's own annotations. Pure; the cluster test is
tests/integration/progress/test_progress_last_checkpoint.py."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from progress_controller.decide import Observation, decide
from progress_controller.lastcheckpoint import pod_patch, wanted
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION as STEP,
)
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_TIME_ANNOTATION as TIME,
)
from trainer_runtime.contract.preemption import (
    checkpoint_step_value,
    checkpoint_time_value,
)
from trainer_runtime.contract.progress import parse_progress, parse_rfc3339

NOW = datetime(2026, 1, 15, 12, 0, 0, tzinfo=UTC)
TIME_FORM = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
STEP_FORM = re.compile(r"0|[1-9][0-9]{0,18}")


def status(latest: Any = "/ckpt/ns/job/checkpoint-150", when: Any = "2026-01-15T10:25:00Z") -> dict:
    ck: dict[str, Any] = {"enabled": True, "checkpointsCreated": 3}
    if latest is not None:
        ck["latestCheckpoint"] = latest
    if when is not None:
        ck["latestCheckpointTime"] = when
    return {"step": 160, "checkpointing": ck}


def pod(annotations: dict[str, str] | None = None, **extra: Any) -> dict:
    md: dict[str, Any] = {"name": "job-worker-0", "uid": "u1", "resourceVersion": "7"}
    if annotations is not None:
        md["annotations"] = annotations
    md.update(extra.pop("metadata", {}))
    return {"metadata": md, "status": {"phase": "Running"}, **extra}


OTHER = {"kubeckpt.io/status": '{"policy": "p"}', "team": "a"}


def test_a_new_checkpoint_is_put_on_a_pod_that_carries_none_or_an_older_one() -> None:
    want = wanted(status())
    assert want == {TIME: "2026-01-15T10:25:00Z", STEP: "150"}
    assert pod_patch(want, pod()) == {TIME: "2026-01-15T10:25:00Z", STEP: "150"}
    older = pod({**OTHER, TIME: "2026-01-15T10:20:00Z", STEP: "100"})
    patch = pod_patch(want, older)
    # Only our two keys: the pod's other annotations are not in the merge patch, so they stay.
    assert patch == {TIME: "2026-01-15T10:25:00Z", STEP: "150"}


def test_a_pod_that_already_carries_the_checkpoint_is_not_written() -> None:
    want = wanted(status())
    assert pod_patch(want, pod({**OTHER, TIME: "2026-01-15T10:25:00Z", STEP: "150"})) is None


def test_only_the_part_that_differs_is_patched() -> None:
    want = wanted(status())
    assert pod_patch(want, pod({TIME: "2026-01-15T10:25:00Z", STEP: "149"})) == {STEP: "150"}


def test_a_pod_with_newer_values_gets_the_status_values() -> None:
    """The status decides which checkpoint is the latest; a pod never disagrees with it (see
    pod_patch's docstring for why a newer-looking value is not kept)."""
    want = wanted(status())
    newer = pod({TIME: "2026-01-15T11:00:00Z", STEP: "200"})
    assert pod_patch(want, newer) == {TIME: "2026-01-15T10:25:00Z", STEP: "150"}


def test_an_equal_time_in_another_form_is_rewritten_in_the_one_form() -> None:
    """Readers compare the strings: "+01:00" and "Z" forms of one instant must not coexist."""
    want = wanted(status(when="2026-01-15T11:25:00.75+01:00"))
    assert want == {TIME: "2026-01-15T10:25:00Z", STEP: "150"}
    assert pod_patch(want, pod({TIME: "2026-01-15T11:25:00+01:00", STEP: "150"})) == {
        TIME: "2026-01-15T10:25:00Z"
    }


def test_no_checkpoint_yet() -> None:
    # No record (or a writer that reports no checkpointing): pods are left as they are.
    assert wanted({}) is None and wanted(None) is None and wanted({"step": 3}) is None
    assert pod_patch(wanted({"step": 3}), pod({TIME: "2026-01-15T10:25:00Z"})) is None
    # Checkpointing reported, no complete checkpoint: nothing to write on a bare pod...
    none_yet = wanted(status(latest=None, when=None))
    assert none_yet == {}
    assert pod_patch(none_yet, pod()) is None
    assert pod_patch(wanted({"checkpointing": {"enabled": False}}), pod(OTHER)) is None
    # ...and values that no longer hold are removed (null in a merge patch).
    stale = pod({**OTHER, TIME: "2026-01-15T10:25:00Z", STEP: "150"})
    assert pod_patch(none_yet, stale) == {TIME: None, STEP: None}


def test_a_part_that_is_not_known_is_absent_not_stale() -> None:
    """Both annotations describe one checkpoint: a new one whose step is unknown (not a
    checkpoint-<step> name) removes the old step rather than pairing it with the new time."""
    want = wanted(status(latest="s3://bucket/runs/job/final", when="2026-01-15T10:30:00Z"))
    assert want == {TIME: "2026-01-15T10:30:00Z"}
    before = pod({TIME: "2026-01-15T10:25:00Z", STEP: "150"})
    assert pod_patch(want, before) == {TIME: "2026-01-15T10:30:00Z", STEP: None}
    assert wanted(status(when=None)) == {STEP: "150"}


def test_pods_going_or_done_are_not_written() -> None:
    want = wanted(status())
    deleting = pod(metadata={"deletionTimestamp": "2026-01-15T11:00:00Z"})
    assert pod_patch(want, deleting) is None
    for phase in ("Succeeded", "Failed"):
        assert pod_patch(want, {**pod(), "status": {"phase": phase}}) is None
    assert pod_patch(want, {**pod(), "status": {"phase": "Pending"}}) is not None


def test_from_a_progress_record_through_the_status_decision() -> None:
    """The values a record gives reach the annotations through `decide`, in the one form."""
    rec = parse_progress(
        json.dumps(
            {
                "step": 160,
                "lastUpdateTime": "2026-01-15T11:59:00Z",
                "checkpointing": {
                    "enabled": True,
                    "latestCheckpoint": "s3://b/runs/job/checkpoint-150/",
                    "latestCheckpointTime": "2026-01-15T05:25:00-05:00",
                },
            }
        )
    )
    dec = decide({}, Observation(pod="job-master-0", record=rec, source="exec"), NOW)
    assert wanted(dec.status) == {TIME: "2026-01-15T10:25:00Z", STEP: "150"}


@pytest.mark.parametrize(
    "location",
    [
        "/c/checkpoint-9223372036854775808",  # 2**63: past int64, what a Go reader parses
        "/c/checkpoint-" + "9" * 5000,  # past Python's int() digit limit too
        "/c/checkpoint-0150",  # not canonical: would claim step 150 twice
        "/c/checkpoint-\u0661\u0665\u0660",  # Arabic-Indic digits, which int() accepts
        "/c/checkpoint--1",
        "/c/checkpoint-",
        "/c/checkpoint-1e3",
        "/c/checkpoint-150\n",
        "/c/checkpoint-150/extra",
        "/c/step-150",
        "",
    ],
)
def test_a_hostile_checkpoint_name_gives_no_step(location: str) -> None:
    assert checkpoint_step_value(location) is None
    assert STEP not in (wanted(status(latest=location)) or {})


def test_the_largest_step_is_int64() -> None:
    assert checkpoint_step_value(f"/c/checkpoint-{2**63 - 1}") == str(2**63 - 1)
    assert checkpoint_step_value("checkpoint-0") == "0"
    assert checkpoint_step_value(150) is None


@pytest.mark.parametrize(
    "when",
    [
        "yesterday",
        "2026-13-01T00:00:00Z",
        "2026-01-15 10:25:00Z",
        "2026-01-15T10:25:00",  # no offset
        "2026-01-15T10:25:00+24:00",
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
        1768472700,
        None,
    ],
)
def test_a_hostile_time_gives_no_time(when: Any) -> None:
    assert checkpoint_time_value(when) is None
    assert TIME not in (wanted(status(when=when)) or {})


def test_times_take_the_one_form() -> None:
    # A small year keeps four digits (strftime would write "10-01-01...").
    assert checkpoint_time_value("0010-01-01T00:00:00Z") == "0010-01-01T00:00:00Z"
    assert checkpoint_time_value("2026-01-15t10:25:00.999z") == "2026-01-15T10:25:00Z"
    assert checkpoint_time_value("2016-12-31T23:59:60Z") == "2016-12-31T23:59:59Z"


@given(
    latest=st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=40),
        st.builds(lambda s: f"/c/checkpoint-{s}", st.text(max_size=30)),
        st.builds(lambda n: f"/c/checkpoint-{n}", st.integers(-(2**70), 2**70)),
    ),
    when=st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=40),
        st.datetimes(timezones=st.timezones()).map(lambda t: t.isoformat()),
        st.builds(
            lambda y, off: f"{y:04d}-06-15T12:00:00{off}",
            st.integers(1, 9999),
            st.sampled_from(["Z", "+23:59", "-23:59", "+00:00"]),
        ),
    ),
)
def test_no_status_value_makes_an_annotation_out_of_form(latest: Any, when: Any) -> None:
    """Whatever the status holds, an annotation is in the contract's form or absent."""
    want = wanted({"checkpointing": {"latestCheckpoint": latest, "latestCheckpointTime": when}})
    assert want is not None and set(want) <= {TIME, STEP}
    if TIME in want:
        assert TIME_FORM.fullmatch(want[TIME]), want
        parse_rfc3339(want[TIME])  # and an RFC 3339 timestamp a reader parses
    if STEP in want:
        assert STEP_FORM.fullmatch(want[STEP]) and int(want[STEP]) < 2**63, want
    patch = pod_patch(want, pod({TIME: "x", STEP: "y"}))
    assert patch is not None and all(v is None or v == want[k] for k, v in patch.items())
