"""The push body: Trainer's shape (what KubeflowCallback sends) and our record, both as strict as a
progress file."""

from __future__ import annotations

import json

import pytest

from progress_controller.push_body import PushBodyError, parse_push
from trainer_runtime.contract.progress import MAX_PROGRESS_BYTES


def trainer(**status: object) -> bytes:
    return json.dumps({"trainerStatus": status}).encode()


def test_kubeflow_callback_body_becomes_a_record() -> None:
    body = trainer(
        lastUpdatedTime="2026-11-27T03:30:00.123456+00:00",
        progressPercentage=42,
        estimatedRemainingSeconds=120,
        metrics=[
            {"name": "loss", "value": "0.5"},
            {"name": "learning_rate", "value": "1e-05"},
            {"name": "current_step", "value": "42"},
            {"name": "total_steps", "value": "100"},
            {"name": "current_epoch", "value": "1.5"},
            {"name": "grad_norm", "value": "3.2"},
        ],
    )
    rec = parse_push(body)
    assert (rec.step, rec.total_steps, rec.epoch) == (42, 100, 1)
    assert rec.loss == "0.5" and rec.learning_rate == "1e-05"
    assert rec.percent_complete == "42"
    assert rec.eta_seconds() == 120
    assert rec.last_update_time == "2026-11-27T03:30:00Z"


def test_our_record_passes_unchanged() -> None:
    rec = parse_push(json.dumps({"step": 7, "loss": "0.25"}).encode())
    assert rec.step == 7 and rec.loss == "0.25"


@pytest.mark.parametrize(
    "body",
    [
        trainer(progressPercentage="42"),  # wrong type
        trainer(progressPercentage=101),
        trainer(progressPercentage=True),
        trainer(estimatedRemainingSeconds=-1),
        trainer(estimatedRemainingSeconds=10**30),  # huge number
        trainer(lastUpdatedTime="yesterday"),
        trainer(metrics={"loss": "1"}),
        trainer(metrics=[{"name": "loss"}]),
        trainer(metrics=[{"name": "loss", "value": 1.0}]),
        trainer(metrics=[{"name": "loss", "value": "nan"}]),
        trainer(metrics=[{"name": "loss", "value": "inf"}]),
        trainer(metrics=[{"name": "current_step", "value": "-3"}]),
        trainer(metrics=[{"name": "current_step", "value": "9" * 40}]),
        trainer(metrics=[{"name": "x", "value": "1"}] * 65),
        trainer(metrics=[{"name": "evil\x1b[2J", "value": "1"}]),  # control characters
        trainer(unknown=1),
        json.dumps({"trainerStatus": {}, "other": 1}).encode(),
        json.dumps({"trainerStatus": []}).encode(),
        b'{"trainerStatus": {"progressPercentage": NaN}}',
        b'{"step": Infinity}',
        b'{"step": 1' + b"0" * 40 + b"}",  # beyond int64
        b"[" * 100 + b"]" * 100,  # deep nesting
        b'{"a":' * 100 + b"1" + b"}" * 100,
        json.dumps({"step": 1, "resumedFrom": "a\nb"}).encode(),
        b"\xff\xfe",
        b"not json",
        b"[]",
        b"x" * (MAX_PROGRESS_BYTES + 1),
    ],
)
def test_hostile_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(PushBodyError):
        parse_push(body)
