"""Progress record contract: exact round trips, validation messages, limits, the short form."""

from __future__ import annotations

import copy
import json
import random
import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from trainer_runtime.contract import (
    MAX_PROGRESS_BYTES,
    TERMINATION_MESSAGE_LIMIT,
    CheckpointingStatus,
    ContractError,
    ProgressRecord,
    format_decimal,
    format_rfc3339,
    parse_progress,
    parse_rfc3339,
)

# DESIGN.md, "Progress file", verbatim.
DESIGN_EXAMPLE = """{
  "epoch": 2, "totalEpochs": 3, "step": 150, "totalSteps": 300,
  "loss": "0.4523", "learningRate": "0.000050", "percentComplete": "50.0",
  "estimatedTimeRemaining": "45m", "stepSeconds": "1.82", "lastUpdateTime": "2024-01-15T10:30:00Z",
  "resumedFrom": "checkpoint-100",
  "checkpointing": {"enabled": true, "latestCheckpoint": "/mnt/kubeckpt/ns/job/checkpoint-150",
                    "checkpointsCreated": 3, "latestCheckpointTime": "2024-01-15T10:25:00Z",
                    "lastSaveSeconds": "2.1", "lastStallSeconds": "0.08"}
}"""

# The seed document's records: the TrainJob status read back through the API, the "Progress Data
# Structure", and the CRD status with the optional metrics.
SEED_STATUS = """{
  "checkpointing": {
    "checkpointsCreated": 0,
    "enabled": true,
    "latestCheckpointTime": "2025-09-07T16:06:37Z"
  },
  "epoch": 2,
  "lastUpdateTime": "2025-09-07T16:06:37Z",
  "learningRate": "0.000041",
  "loss": "2.4058",
  "percentComplete": "28.3",
  "step": 354,
  "totalEpochs": 10,
  "totalSteps": 1250
}"""
SEED_STRUCTURE = """{
  "epoch": 2, "totalEpochs": 3, "step": 150, "totalSteps": 300,
  "loss": "0.4523", "learningRate": "0.000050", "percentComplete": "50.0",
  "lastUpdateTime": "2024-01-15T10:30:00Z",
  "checkpointing": {"enabled": true, "latestCheckpoint": "/workspace/checkpoints/checkpoint-150",
                    "checkpointsCreated": 3, "latestCheckpointTime": "2024-01-15T10:25:00Z"}
}"""
SEED_CRD_STATUS = """{
  "epoch": 2, "totalEpochs": 3, "step": 150, "totalSteps": 300,
  "loss": "0.4523", "accuracy": "0.8756", "validationLoss": "0.5123",
  "validationAccuracy": "0.8234", "learningRate": "0.000050", "percentComplete": "50.0",
  "estimatedTimeRemaining": "45m", "lastUpdateTime": "2024-01-15T10:30:00Z",
  "checkpointing": {"enabled": true, "latestCheckpoint": "/workspace/checkpoints/checkpoint-150",
                    "checkpointsCreated": 3, "latestCheckpointTime": "2024-01-15T10:25:00Z"}
}"""


def design() -> dict[str, Any]:
    return json.loads(DESIGN_EXAMPLE)


def with_field(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    target = data
    for key in parents:
        target = target[key]
    target[last] = value
    return data


def rejects(data: dict[str, Any] | str | bytes) -> str:
    raw = data if isinstance(data, str | bytes) else json.dumps(data)
    with pytest.raises(ContractError) as exc:
        parse_progress(raw)
    assert isinstance(exc.value, ValueError)
    return str(exc.value)


# --- round trips ---


@pytest.mark.parametrize("text", [DESIGN_EXAMPLE, SEED_STATUS, SEED_STRUCTURE, SEED_CRD_STATUS])
def test_documented_records_round_trip_exactly(text: str) -> None:
    original = json.loads(text)
    record = parse_progress(text)
    assert record.to_dict() == original
    assert json.loads(record.to_json()) == original
    assert parse_progress(record.to_json(indent=2)) == record
    assert parse_progress(text.encode()) == record


def test_design_example_fields_are_typed() -> None:
    r = parse_progress(DESIGN_EXAMPLE)
    assert (r.epoch, r.total_epochs, r.step, r.total_steps) == (2, 3, 150, 300)
    assert r.loss == "0.4523" and r.loss_value() == pytest.approx(0.4523)
    assert r.learning_rate_value() == pytest.approx(5e-5)
    assert r.percent_complete_value() == 50.0
    assert r.step_seconds_value() == pytest.approx(1.82)
    assert r.eta_seconds() == 45 * 60
    assert r.last_update_time_value() == datetime(2024, 1, 15, 10, 30, tzinfo=UTC)
    assert r.resumed_from == "checkpoint-100"
    assert r.accuracy is None and r.accuracy_value() is None
    c = r.checkpointing
    assert c is not None
    assert c.enabled is True and c.checkpoints_created == 3
    assert c.latest_checkpoint == "/mnt/kubeckpt/ns/job/checkpoint-150"
    assert c.last_save_seconds_value() == pytest.approx(2.1)
    assert c.last_stall_seconds_value() == pytest.approx(0.08)
    assert c.latest_checkpoint_time_value() == datetime(2024, 1, 15, 10, 25, tzinfo=UTC)


def test_to_dict_emits_design_order() -> None:
    r = parse_progress(SEED_STATUS)  # keys sorted alphabetically in the seed
    assert list(r.to_dict())[:4] == ["epoch", "totalEpochs", "step", "totalSteps"]


def test_unknown_keys_are_kept_at_both_levels() -> None:
    data = design()
    data["gradNorm"] = "0.93"
    data["tokensPerSecond"] = 12345
    data["nested"] = {"a": [1, 2.5, None, True, {"b": "c"}], "z": None}
    data["checkpointing"]["backend"] = "s3"
    data["checkpointing"]["shards"] = [{"rank": 0, "bytes": 10}]
    record = parse_progress(json.dumps(data))
    assert record.extra == {
        "gradNorm": "0.93",
        "tokensPerSecond": 12345,
        "nested": {"a": [1, 2.5, None, True, {"b": "c"}], "z": None},
    }
    assert record.checkpointing is not None
    assert record.checkpointing.extra == {"backend": "s3", "shards": [{"rank": 0, "bytes": 10}]}
    assert record.to_dict() == data
    assert parse_progress(record.to_json()).to_dict() == data


def test_minimal_record_and_empty_checkpointing() -> None:
    assert parse_progress('{"step": 0}').to_dict() == {"step": 0}
    r = parse_progress('{"step": 1, "checkpointing": {}}')
    assert r.checkpointing == CheckpointingStatus()
    assert r.to_dict() == {"step": 1, "checkpointing": {}}


def test_non_ascii_is_kept_and_written_as_utf8() -> None:
    data = {"step": 3, "resumedFrom": "checkpoint-2-\u00e9\u6f22", "note": "\u2713"}
    text = parse_progress(json.dumps(data)).to_json()
    assert "\u6f22" in text  # not \u-escaped: the file stays small
    assert parse_progress(text.encode("utf-8")).to_dict() == data


# --- size and syntax limits ---


def test_oversized_input_is_rejected_with_size_and_limit() -> None:
    data = {"step": 1, "blob": "x" * MAX_PROGRESS_BYTES}
    raw = json.dumps(data).encode()
    message = rejects(raw)
    assert str(len(raw)) in message and str(MAX_PROGRESS_BYTES) in message
    message = rejects(raw.decode())  # the same for str input
    assert str(len(raw)) in message


def test_exactly_the_limit_is_accepted() -> None:
    head = '{"step": 1, "pad": "'
    raw = head + "x" * (MAX_PROGRESS_BYTES - len(head) - 2) + '"}'
    assert len(raw.encode()) == MAX_PROGRESS_BYTES
    assert parse_progress(raw).step == 1
    assert "over the limit" in rejects(raw[:-2] + 'x"}')


def test_size_counts_utf8_bytes_not_characters() -> None:
    # 40 000 characters but 80 000 bytes.
    raw = json.dumps({"step": 1, "pad": "\u00e9" * 40_000}, ensure_ascii=False)
    assert len(raw) < MAX_PROGRESS_BYTES < len(raw.encode())
    assert "over the limit" in rejects(raw)
    assert "over the limit" in rejects(raw.encode())


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ("[]", "array"),
        ("[1, 2]", "array"),
        ("1", "integer"),
        ("2.5", "number"),
        ("null", "null"),
        ('"text"', "string"),
        ("true", "boolean"),
    ],
)
def test_json_that_is_not_an_object_is_rejected(raw: str, kind: str) -> None:
    message = rejects(raw)
    assert "JSON object" in message and kind in message


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "{",
        '{"step": 1,}',
        "{'step': 1}",
        '{"step": 1} trailing',
        '{"step": NaN}',
        '{"step": 1, "x": Infinity}',
        '{"step": 1, "x": -Infinity}',
        "[" * 5000 + "]" * 5000,
    ],
)
def test_invalid_json_is_rejected(raw: str) -> None:
    assert "not valid JSON" in rejects(raw)


def test_invalid_utf8_is_rejected() -> None:
    assert "UTF-8" in rejects(b'{"step": 1, "x": "\xff\xfe"}')
    # Not auto-detected as UTF-16 either, as json.loads(bytes) would.
    assert "UTF-8" in rejects('{"step": 1}'.encode("utf-16"))


def test_lone_surrogate_escape_is_rejected() -> None:
    assert "Unicode" in rejects('{"step": 1, "x": "\\ud800"}')


# --- field validation ---


def test_step_is_required() -> None:
    message = rejects({"epoch": 1})
    assert message.startswith("step:") and "missing" in message


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("step", "150", "step: expected integer, got string"),
        ("step", True, "step: expected integer, got boolean"),
        ("step", 150.0, "step: expected integer, got number"),
        ("step", None, "step: expected integer, got null"),
        ("step", -1, "step: must be between 0"),
        ("step", 2**63, "step: must be between 0"),
        ("epoch", False, "epoch: expected integer, got boolean"),
        ("totalEpochs", [3], "totalEpochs: expected integer, got array"),
        ("totalSteps", -300, "totalSteps: must be between 0"),
        ("loss", 0.4523, "loss: expected string, got number"),
        ("learningRate", None, "learningRate: expected string, got null"),
        ("lastUpdateTime", 1705314600, "lastUpdateTime: expected string, got integer"),
        ("resumedFrom", {"step": 100}, "resumedFrom: expected string, got object"),
        ("estimatedTimeRemaining", 2700, "estimatedTimeRemaining: expected string, got integer"),
        ("checkpointing", [], "checkpointing: expected object, got array"),
        ("checkpointing", "on", "checkpointing: expected object, got string"),
        ("checkpointing", None, "checkpointing: expected object, got null"),
        (
            "checkpointing.checkpointsCreated",
            "3",
            "checkpointing.checkpointsCreated: expected integer, got string",
        ),
        (
            "checkpointing.checkpointsCreated",
            True,
            "checkpointing.checkpointsCreated: expected integer, got boolean",
        ),
        ("checkpointing.checkpointsCreated", -1, "checkpointing.checkpointsCreated: must be"),
        ("checkpointing.enabled", "true", "checkpointing.enabled: expected boolean, got string"),
        ("checkpointing.enabled", 1, "checkpointing.enabled: expected boolean, got integer"),
        ("checkpointing.latestCheckpoint", 150, "checkpointing.latestCheckpoint: expected string"),
        ("checkpointing.lastSaveSeconds", 2.1, "checkpointing.lastSaveSeconds: expected string"),
    ],
)
def test_wrong_types_name_the_field(path: str, value: Any, expected: str) -> None:
    assert rejects(with_field(design(), path, value)).startswith(expected)


def test_error_carries_the_field_path() -> None:
    with pytest.raises(ContractError) as exc:
        parse_progress(json.dumps(with_field(design(), "checkpointing.enabled", "yes")))
    assert exc.value.field == "checkpointing.enabled"


DECIMAL_FIELDS = [
    "loss",
    "learningRate",
    "percentComplete",
    "stepSeconds",
    "accuracy",
    "validationLoss",
    "validationAccuracy",
    "checkpointing.lastSaveSeconds",
    "checkpointing.lastStallSeconds",
]


@pytest.mark.parametrize("path", DECIMAL_FIELDS)
@pytest.mark.parametrize(
    "bad",
    ["NaN", "nan", "inf", "-Infinity", "abc", "", " 1.0", "1,5", "0x10", "1e999", "1_000", "1.2.3"],
)
def test_string_numbers_must_be_finite_decimals(path: str, bad: str) -> None:
    message = rejects(with_field(design(), path, bad))
    assert message.startswith(f"{path}: expected a finite decimal number")
    assert repr(bad) in message


@pytest.mark.parametrize("path", DECIMAL_FIELDS)
@pytest.mark.parametrize("good", ["0", "0.000050", "5e-05", "1E+3", ".5", "12."])
def test_string_numbers_accept_decimal_forms(path: str, good: str) -> None:
    record = parse_progress(json.dumps(with_field(design(), path, good)))
    assert record.to_dict() == with_field(design(), path, good)


@pytest.mark.parametrize(
    "path",
    [
        "percentComplete",
        "stepSeconds",
        "checkpointing.lastSaveSeconds",
        "checkpointing.lastStallSeconds",
    ],
)
def test_durations_and_percentages_cannot_be_negative(path: str) -> None:
    assert rejects(with_field(design(), path, "-0.5")).startswith(f"{path}: must be >= 0")


def test_loss_may_be_negative() -> None:
    assert parse_progress(json.dumps(with_field(design(), "loss", "-1.25"))).loss_value() == -1.25


@pytest.mark.parametrize("path", ["lastUpdateTime", "checkpointing.latestCheckpointTime"])
@pytest.mark.parametrize(
    "bad",
    [
        "2024-01-15 10:30:00Z",
        "2024-01-15T10:30:00",
        "2024-13-01T00:00:00Z",
        "2024-02-30T00:00:00Z",
        "2024-01-15T24:00:00Z",
        "2024-01-15T10:30:00+25:00",
        "2024-1-15T10:30:00Z",
        "yesterday",
        "1705314600",
    ],
)
def test_times_must_be_rfc3339(path: str, bad: str) -> None:
    message = rejects(with_field(design(), path, bad))
    assert message.startswith(f"{path}: expected an RFC 3339 timestamp")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-15T10:30:00Z", datetime(2024, 1, 15, 10, 30, tzinfo=UTC)),
        ("2024-01-15t10:30:00z", datetime(2024, 1, 15, 10, 30, tzinfo=UTC)),
        (
            "2024-01-15T10:30:00.123456789+02:00",
            datetime(2024, 1, 15, 10, 30, 0, 123456, tzinfo=timezone(timedelta(hours=2))),
        ),
        ("2016-12-31T23:59:60Z", datetime(2016, 12, 31, 23, 59, 59, tzinfo=UTC)),  # leap second
    ],
)
def test_rfc3339_forms(text: str, expected: datetime) -> None:
    assert parse_rfc3339(text) == expected
    assert parse_progress(json.dumps({"step": 1, "lastUpdateTime": text})).last_update_time == text


@pytest.mark.parametrize(
    "path", ["resumedFrom", "estimatedTimeRemaining", "checkpointing.latestCheckpoint"]
)
def test_strings_are_capped_at_1024_characters(path: str) -> None:
    ok = with_field(design(), path, "c" * 1024)
    assert parse_progress(json.dumps(ok)).to_dict() == ok
    message = rejects(with_field(design(), path, "c" * 1025))
    assert message.startswith(f"{path}:") and "1025" in message and "1024" in message


def test_numeric_strings_are_capped_too() -> None:
    message = rejects(with_field(design(), "loss", "0." + "1" * 1100))
    assert message.startswith("loss:") and "1024" in message


def test_eta_is_free_text_but_read_when_it_can_be() -> None:
    assert parse_progress('{"step": 1, "estimatedTimeRemaining": "1h2m"}').eta_seconds() == 3720
    assert parse_progress('{"step": 1, "estimatedTimeRemaining": "90"}').eta_seconds() == 90
    assert parse_progress('{"step": 1, "estimatedTimeRemaining": "soon"}').eta_seconds() is None
    assert parse_progress('{"step": 1, "estimatedTimeRemaining": "-5m"}').eta_seconds() is None


# --- construction in code (the writer side) ---


def test_constructed_records_are_validated() -> None:
    with pytest.raises(ContractError, match=r"^step: expected integer, got boolean"):
        ProgressRecord(step=True)
    with pytest.raises(ContractError, match=r"^loss: expected string, got number"):
        ProgressRecord(step=1, loss=0.5)  # type: ignore[arg-type]
    with pytest.raises(ContractError, match=r"^checkpointing\.lastSaveSeconds"):
        ProgressRecord(step=1, checkpointing=CheckpointingStatus(last_save_seconds="fast"))
    with pytest.raises(ContractError, match="known field"):
        ProgressRecord(step=1, extra={"loss": "0.1"})
    with pytest.raises(ContractError, match="known field"):
        CheckpointingStatus(extra={"enabled": True})


def test_mutation_is_caught_on_serialisation() -> None:
    record = parse_progress(DESIGN_EXAMPLE)
    record.step = -5
    with pytest.raises(ContractError, match=r"^step:"):
        record.to_json()


def test_writer_helpers_produce_valid_values() -> None:
    record = ProgressRecord(
        step=10,
        loss=format_decimal(0.45231, 4),
        learning_rate=format_decimal(5e-5, 6),
        last_update_time=format_rfc3339(
            datetime(2024, 1, 15, 12, 30, tzinfo=timezone(timedelta(hours=2)))
        ),
    )
    assert record.to_dict() == {
        "step": 10,
        "loss": "0.4523",
        "learningRate": "0.000050",
        "lastUpdateTime": "2024-01-15T10:30:00Z",
    }
    with pytest.raises(ContractError):
        format_decimal(float("nan"))


# --- the short form for /dev/termination-log ---


def test_termination_message_is_the_full_record_when_it_fits() -> None:
    record = parse_progress(DESIGN_EXAMPLE)
    message = record.to_termination_message()
    assert json.loads(message) == design()
    assert " " not in message.replace("2024-01-15T", "")  # compact separators
    assert record.short_form() == record


def big_record() -> ProgressRecord:
    data = design()
    data["resumedFrom"] = "r" * 1024
    data["checkpointing"]["latestCheckpoint"] = "/mnt/" + "p" * 1000
    data["checkpointing"]["bigNested"] = "n" * 20_000
    data["hugeExtra"] = "h" * 30_000
    data["manyExtras"] = {f"k{i}": i for i in range(500)}
    data["smallExtra"] = "keep-me"
    return parse_progress(json.dumps(data))


def test_short_form_fits_with_huge_fields_and_extras() -> None:
    record = big_record()
    assert len(record.to_json()) > 50_000
    message = record.to_termination_message()
    assert len(message.encode("utf-8")) <= TERMINATION_MESSAGE_LIMIT
    short = parse_progress(message)  # the reconciler reads it with the same parser
    assert short == record.short_form()
    assert short.step == 150 and short.total_steps == 300
    # Extras go first, largest first: the small one survives, and so do known fields.
    assert "hugeExtra" not in short.extra and "manyExtras" not in short.extra
    assert short.extra == {"smallExtra": "keep-me"}
    assert short.checkpointing is not None and "bigNested" not in short.checkpointing.extra
    assert short.resumed_from == "r" * 1024
    assert short.checkpointing.latest_checkpoint == record.checkpointing.latest_checkpoint  # type: ignore[union-attr]


def test_short_form_drops_optional_fields_least_important_first() -> None:
    long_number = "0." + "1" * 1000  # valid, 1002 characters
    record = ProgressRecord(
        step=7,
        epoch=1,
        total_epochs=2,
        total_steps=10,
        loss=long_number,
        learning_rate=long_number,
        percent_complete="70.0",
        resumed_from="r" * 1024,
        accuracy=long_number,
        last_update_time="2024-01-15T10:30:00Z",
        checkpointing=CheckpointingStatus(latest_checkpoint="/mnt/ckpt/checkpoint-5", enabled=True),
        extra={"e": "x" * 100},
    )
    short = record.short_form()
    assert len(record.to_termination_message()) <= TERMINATION_MESSAGE_LIMIT
    assert short.extra == {}
    assert short.resumed_from is None  # first to go
    # Nothing more than needed is dropped: without resumedFrom the record fits.
    assert short.accuracy == short.learning_rate == short.loss == long_number
    assert short.percent_complete == "70.0"
    assert short.checkpointing is not None
    assert short.checkpointing.latest_checkpoint == "/mnt/ckpt/checkpoint-5"
    assert (short.step, short.epoch, short.total_epochs, short.total_steps) == (7, 1, 2, 10)


def test_short_form_drop_order_when_much_must_go() -> None:
    long_number = "1." + "0" * 1000
    record = ProgressRecord(
        step=7,
        loss=long_number,
        learning_rate=long_number,
        accuracy=long_number,
        validation_loss=long_number,
        validation_accuracy=long_number,
        percent_complete=long_number,
        step_seconds=long_number,
        checkpointing=CheckpointingStatus(
            latest_checkpoint="/c" * 500, last_save_seconds=long_number
        ),
    )
    short = record.short_form()
    assert len(record.to_termination_message()) <= TERMINATION_MESSAGE_LIMIT
    # The validation metrics, then accuracy and learning rate, go before loss and progress.
    assert short.validation_accuracy is None and short.validation_loss is None
    assert short.accuracy is None and short.learning_rate is None
    assert short.loss == short.percent_complete == long_number
    assert short.checkpointing is not None
    assert short.checkpointing.latest_checkpoint == "/c" * 500


def test_short_form_with_escaped_non_ascii_stays_within_bytes() -> None:
    # 1024 CJK characters are 6 KiB once \u-escaped: every long field must go, the counts stay.
    cjk = "\u6f22" * 1024
    record = ProgressRecord(
        step=2**63 - 1,
        epoch=2**63 - 1,
        total_epochs=2**63 - 1,
        total_steps=2**63 - 1,
        resumed_from=cjk,
        estimated_time_remaining=cjk,
        checkpointing=CheckpointingStatus(
            latest_checkpoint=cjk, checkpoints_created=2**63 - 1, extra={"x": cjk}
        ),
        extra={f"k{i}": cjk for i in range(10)},
    )
    message = record.to_termination_message()
    assert len(message.encode("utf-8")) <= TERMINATION_MESSAGE_LIMIT
    assert message.isascii()
    assert parse_progress(message).step == 2**63 - 1


def test_short_form_with_many_small_extras_is_fast_and_fits() -> None:
    extra = {f"metric_{i:05d}": f"{i}" for i in range(5000)}
    record = ProgressRecord(step=5, extra=extra)
    message = record.to_termination_message()
    assert len(message) <= TERMINATION_MESSAGE_LIMIT
    kept = parse_progress(message).extra
    assert 0 < len(kept) < 5000
    assert all(extra[k] == v for k, v in kept.items())


def test_short_form_smaller_limit() -> None:
    message = parse_progress(DESIGN_EXAMPLE).to_termination_message(limit=200)
    assert len(message) <= 200
    assert json.loads(message)["step"] == 150


# --- randomised round trip: serialise(parse(x)) == x for valid x ---


def random_record(rng: random.Random) -> dict[str, Any]:
    def decimal() -> str:
        return rng.choice(["0", "1.5", "0.000050", "5e-05", "12.", ".25", "-3.25", "100.0"])

    def non_negative() -> str:
        return rng.choice(["0", "1.82", "2.1", "5e-05", "99.9", ".5"])

    def json_value(depth: int = 0) -> Any:
        kinds = ["str", "int", "float", "bool", "null"] + (["list", "dict"] if depth < 3 else [])
        kind = rng.choice(kinds)
        if kind == "str":
            return rng.choice(["", "x", "\u00e9\u6f22", "a\nb", '"q"'])
        if kind == "int":
            return rng.randint(-(10**12), 10**12)
        if kind == "float":
            return rng.uniform(-1e6, 1e6)
        if kind == "bool":
            return rng.random() < 0.5
        if kind == "null":
            return None
        if kind == "list":
            return [json_value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}": json_value(depth + 1) for i in range(rng.randint(0, 3))}

    makers: dict[str, Any] = {
        "epoch": lambda: rng.randint(0, 100),
        "totalEpochs": lambda: rng.randint(0, 100),
        "totalSteps": lambda: rng.randint(0, 2**63 - 1),
        "loss": decimal,
        "learningRate": decimal,
        "percentComplete": non_negative,
        "estimatedTimeRemaining": lambda: rng.choice(["45m", "1h2m", "soon", ""]),
        "stepSeconds": non_negative,
        "lastUpdateTime": lambda: rng.choice(
            ["2024-01-15T10:30:00Z", "2024-01-15T10:30:00.5+01:00"]
        ),
        "resumedFrom": lambda: rng.choice(["checkpoint-100", ""]),
        "accuracy": decimal,
        "validationLoss": decimal,
        "validationAccuracy": decimal,
    }
    ckpt_makers: dict[str, Any] = {
        "enabled": lambda: rng.random() < 0.5,
        "latestCheckpoint": lambda: "/mnt/kubeckpt/ns/job/checkpoint-150",
        "checkpointsCreated": lambda: rng.randint(0, 1000),
        "latestCheckpointTime": lambda: "2024-01-15T10:25:00Z",
        "lastSaveSeconds": non_negative,
        "lastStallSeconds": non_negative,
    }
    data: dict[str, Any] = {"step": rng.randint(0, 2**63 - 1)}
    for key, make in makers.items():
        if rng.random() < 0.5:
            data[key] = make()
    if rng.random() < 0.7:
        ckpt = {k: make() for k, make in ckpt_makers.items() if rng.random() < 0.5}
        ckpt.update({f"ckptExtra{i}": json_value() for i in range(rng.randint(0, 2))})
        data["checkpointing"] = ckpt
    data.update({f"extra{i}": json_value() for i in range(rng.randint(0, 3))})
    keys = list(data)
    rng.shuffle(keys)
    return {k: data[k] for k in keys}


def test_random_valid_records_round_trip() -> None:
    rng = random.Random(20240115)
    for _ in range(300):
        data = random_record(rng)
        record = parse_progress(json.dumps(data))
        assert record.to_dict() == data
        assert parse_progress(record.to_json()) == record
        short = json.loads(record.to_termination_message())
        assert short["step"] == data["step"]


def test_early_years_keep_four_digits_and_times_without_utc_form_are_refused() -> None:
    """Found on the cluster: year 10 was written as "10-01-01T..." (the API server refused the
    status with 422, so the job's status stalled) and year 1 at +01:00 raised OverflowError."""
    from trainer_runtime.contract.progress import format_rfc3339, parse_rfc3339

    assert format_rfc3339(parse_rfc3339("0010-01-01T00:00:00Z")) == "0010-01-01T00:00:00Z"
    assert format_rfc3339(parse_rfc3339("2024-01-15T12:30:00+02:00")) == "2024-01-15T10:30:00Z"
    with pytest.raises(ContractError):
        parse_rfc3339("0001-01-01T00:00:00+01:00")


def test_deep_nesting_is_rejected_whatever_the_recursion_limit() -> None:
    # json's own RecursionError depends on sys.getrecursionlimit(), which hypothesis raises while
    # it runs: the suite once parsed 5000 nested arrays as JSON when run after a property test.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)
    try:
        assert "nested over" in rejects("[" * 5000 + "]" * 5000)
        assert "nested over" in rejects('{"a": ' + "[" * 40 + "]" * 40 + "}")
    finally:
        sys.setrecursionlimit(old)
    # Brackets inside strings are text, not nesting.
    assert parse_progress('{"step": 2, "note": "' + "[{" * 100 + '\\\\"}').step == 2
