"""Checkpoints of which none verifies (issue 27 item 4): the runtime's record names them
(checkpointing.unverifiableCheckpoints, from the progress file or the termination message) and
the controller's decision turns that into the condition CheckpointsUnverifiable and one Warning
Event, escaped and bounded like every runtime-supplied text; a later process that resumed clears
it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from kubeckpt_api.status import CHECKPOINTS_UNVERIFIABLE, MAX_CONDITION_MESSAGE, condition
from progress_controller.decide import Decision, Observation, decide
from trainer_runtime.contract.progress import (
    UNVERIFIABLE_CHECKPOINTS,
    format_rfc3339,
    parse_progress,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NAMED = (
    "none of 2 checkpoints verifies; not starting from step 0 (...): "
    "/c/checkpoint-14: checksum mismatch: model.pt: expected xxh3_128 aa, got bb; "
    "/c/checkpoint-7: missing file: model.pt"
)


def record(step: int, incarnation: str, unverifiable: Any = None) -> Any:
    ck: dict[str, Any] = {"enabled": True}
    if unverifiable is not None:
        ck[UNVERIFIABLE_CHECKPOINTS] = unverifiable
    data = {
        "step": step,
        "lastUpdateTime": format_rfc3339(T0),
        "incarnation": incarnation,
        "checkpointing": ck,
    }
    return parse_progress(json.dumps(data))


def read(status: dict, rec: Any, source: str = "terminationMessage") -> Decision:
    obs = Observation(pod="m-0", record=rec, source=source, job_created=T0 - timedelta(hours=1))
    return decide(status, obs, T0)


def test_the_condition_names_the_bad_checkpoints_and_one_event_says_so() -> None:
    d = read({}, record(0, "a", {"reason": "CheckpointsUnverifiable", "message": NAMED}))
    c = condition(d.status["conditions"], CHECKPOINTS_UNVERIFIABLE)
    assert c is not None and (c["status"], c["reason"]) == ("True", "CheckpointsUnverifiable")
    assert "/c/checkpoint-14: checksum mismatch: model.pt" in c["message"]
    assert "/c/checkpoint-7: missing file: model.pt" in c["message"]
    [event] = [e for e in d.events if e.reason == "CheckpointsUnverifiable"]
    assert event.type == "Warning" and event.message == c["message"]
    # The same record again (exec, then the termination message): nothing said twice.
    again = read(d.status, record(0, "a", {"reason": "CheckpointsUnverifiable", "message": NAMED}))
    assert [e for e in again.events if e.reason == "CheckpointsUnverifiable"] == []
    # A later process that resumed (its record without the key) clears it.
    later = read(again.status, record(20, "b"), source="exec")
    c = condition(later.status["conditions"], CHECKPOINTS_UNVERIFIABLE)
    assert c is not None and (c["status"], c["reason"]) == ("False", "NoneFound")


def test_started_fresh_and_a_newer_format_keep_their_reasons() -> None:
    for reason in ("StartedFresh", "UnsupportedFormatVersion"):
        d = read({}, record(0, "a", {"reason": reason, "message": "m"}))
        c = condition(d.status["conditions"], CHECKPOINTS_UNVERIFIABLE)
        assert c is not None and c["reason"] == reason
        assert [e.reason for e in d.events if e.type == "Warning"] == [reason]


def test_runtime_text_is_escaped_and_bounded_and_an_unknown_reason_is_not_used() -> None:
    hostile = "\x1b[2J/c/checkpoint-1: bad\n" + "x" * 5000
    d = read({}, record(0, "a", {"reason": "Reason With Spaces\n", "message": hostile}))
    c = condition(d.status["conditions"], CHECKPOINTS_UNVERIFIABLE)
    assert c is not None and c["reason"] == "CheckpointsUnverifiable"
    assert "\x1b" not in c["message"] and "\n" not in c["message"]
    assert len(c["message"]) <= MAX_CONDITION_MESSAGE
    [event] = [e for e in d.events if e.type == "Warning"]
    assert len(event.message) <= MAX_CONDITION_MESSAGE and "\x1b" not in event.message


def test_no_condition_while_nothing_was_found_and_a_malformed_value_is_ignored() -> None:
    for value in (None, "a plain string", {"reason": "x"}, {"message": 3}):
        d = read({}, record(5, "a", value))
        assert condition(d.status["conditions"], CHECKPOINTS_UNVERIFIABLE) is None
        assert [e for e in d.events if e.type == "Warning"] == []
