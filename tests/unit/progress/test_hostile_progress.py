"""A progress file is written by user code in a training pod: whatever it holds must come out of
the reader and the status decision bounded and printable, for this job only. Property-based:
hostile files are generated and pushed through `reading.parse` and `status.decide`."""

from __future__ import annotations

import json
import unicodedata
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeckpt_api.status import MAX_CONDITION_MESSAGE
from kubeckpt_api.status_model import CheckpointingStatus, RecordStatus, fits
from progress_controller.decide import Observation, decide
from progress_controller.reading import ReadError, parse

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NASTY = "\x00\x07\x1b[31m\n\r\t\x7f\u0085\u2028\u202e/..\\\"'`$(){}<>%s a"
hostile_text = st.one_of(
    st.text(alphabet=st.sampled_from(NASTY), max_size=300),
    st.text(max_size=50),
    st.integers(1, 9000).map(lambda n: "x" * n),
)
hostile_int = st.one_of(
    st.integers(-5, 5), st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63)]), st.integers()
)
anything = st.recursive(
    st.none() | st.booleans() | hostile_int | hostile_text | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=8,
)


def _record(step: int, top: list, ck: list, extra: dict) -> dict[str, Any]:
    """A sound record with a few fields replaced by hostile values (one bad field at a time is
    what gets past the contract's validation and reaches the status)."""
    record: dict[str, Any] = {
        **extra,
        "step": step,
        "totalSteps": 100,
        "loss": "0.5",
        "lastUpdateTime": "2026-01-01T11:59:00Z",
        "checkpointing": {"enabled": True, "latestCheckpoint": "/c/checkpoint-1"},
    }
    record.update(top)
    if isinstance(record["checkpointing"], dict):
        record["checkpointing"].update(ck)
    return record


top_fields = st.one_of(
    st.tuples(
        st.sampled_from(
            ["resumedFrom", "estimatedTimeRemaining", "loss", "learningRate", "namespace", "name"]
        ),
        hostile_text,
    ),
    st.tuples(st.sampled_from(["step", "totalSteps", "epoch"]), hostile_int),
    st.tuples(st.just("metrics"), st.dictionaries(hostile_text, anything, max_size=20)),
    st.tuples(st.just("checkpointing"), anything),
)
checkpoint_fields = st.one_of(
    st.tuples(
        st.sampled_from(
            ["latestCheckpoint", "lastError", "latestCheckpointReason", "latestCheckpointTime"]
        ),
        st.one_of(hostile_text, st.just("/ckpt/other-job/checkpoint-9")),
    ),
    st.tuples(st.sampled_from(["checkpointsCreated", "failedSaves"]), hostile_int),
    st.tuples(st.just("enabled"), anything),
)
records = st.builds(
    _record,
    st.integers(0, 10**6),
    st.lists(top_fields, max_size=3),
    st.lists(checkpoint_fields, max_size=3),
    st.dictionaries(hostile_text, anything, max_size=3),
)
bodies = st.one_of(
    records.map(lambda r: json.dumps(r).encode()),
    st.integers(4_400, 20_000).map(lambda n: b'{"step": ' + b"9" * n + b"}"),  # over int's limit
    st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n),
    st.binary(max_size=200),
    st.just(b'{"step": 1, ' + b'"k": 1, ' * 9000 + b'"z": 2}'),  # 64 KiB of keys
)


def _printable(text: str) -> bool:
    """No control, format, surrogate, private-use or line-separator character."""
    unsafe = {"Cc", "Cf", "Cs", "Co", "Zl", "Zp"}
    return not any(unicodedata.category(ch) in unsafe for ch in text)


def _check_bounded(status: dict[str, Any]) -> None:
    ck = status.get("checkpointing") or {}
    for fields, model in ((status, RecordStatus), (ck, CheckpointingStatus)):
        for key, fit in fits(model).items():
            if key in fields and fit.kind in ("text", "decimal"):
                assert isinstance(fields[key], str) and len(fields[key]) <= fit.limit, key
                assert _printable(fields[key]), (key, fields[key])
    for c in status.get("conditions") or []:
        assert len(c["message"]) <= MAX_CONDITION_MESSAGE
        assert _printable(c["message"]), c["message"]
    for key in ("step", "totalSteps", "epoch"):
        if key in status:  # an int64 in the CRD: the API server rejects anything larger
            assert -(2**63) <= status[key] < 2**63, (key, status[key])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, prev_step=st.one_of(st.none(), st.integers(0, 100)))
def test_a_hostile_progress_file_comes_out_bounded_and_printable(
    body: bytes, prev_step: int | None
) -> None:
    try:
        record = parse(body)
    except ReadError as e:  # refused with a reason, and a message that is safe to show
        assert e.reason.isidentifier() and len(e.message) <= MAX_CONDITION_MESSAGE * 4
        record = None
        obs = Observation(pod="job-master-0", error_reason=e.reason, error_message=e.message)
    else:
        obs = Observation(pod="job-master-0", record=record, source="exec")
    prev = {} if prev_step is None else {"step": prev_step, "observedPod": "job-master-0"}
    dec = decide(prev, obs, NOW)
    _check_bounded(dec.status)
    for event in dec.events:
        assert len(event.message) <= MAX_CONDITION_MESSAGE, event
        assert _printable(event.message), event.message
    assert "namespace" not in dec.status and "name" not in dec.status
