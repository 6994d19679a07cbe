"""The TrainingProgress status fields a progress record gives, as pydantic models.

The record has already been validated by the contract's parser (trainer_runtime.contract, which
stays standard-library because it runs in training pods); these models fit it to the CRD's
status schema (config/crd/bases/kubeckpt.io_trainingprogresses.yaml), field by field: only the
schema's fields, strings within its maxLength (free text cut with "...", a decimal left out
because a cut number would be wrong), text made printable (it reaches `kubectl describe` and
Events), times in one form (UTC, seconds). tests/unit/test_crds.py checks that the fields and
limits here are the schema's.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

from trainer_runtime.contract.progress import (
    LATEST_CHECKPOINT_REASON,
    RESUMED_TIER,
    ProgressRecord,
    format_rfc3339,
    parse_rfc3339,
)

# Control, format (bidi overrides, zero-width), surrogate, private-use, unassigned and
# line/paragraph separator characters: a progress file is written by user code, and what it holds
# reaches `kubectl describe` and Events; these could rewrite a terminal or hide text there (an
# unassigned code point may be given any meaning, a format one included, by a later Unicode).
_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(text: str) -> str:
    """`text` with every unsafe character written as an escape (\\x1b, \\u202e)."""
    if all(unicodedata.category(ch) not in _UNSAFE for ch in text):
        return text
    return "".join(
        ch
        if unicodedata.category(ch) not in _UNSAFE
        else (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        for ch in text
    )


@dataclass(frozen=True)
class Fit:
    """How a string field is fitted to the schema; also the field's validator."""

    kind: Literal["decimal", "text", "time"]
    limit: int = 0

    def __call__(self, value: str | None) -> str | None:
        if value is None:
            return None
        if self.kind == "time":
            return format_rfc3339(parse_rfc3339(value))
        if self.kind == "text":
            value = printable(value)
        if len(value) > self.limit:
            return None if self.kind == "decimal" else value[: self.limit - 3] + "..."
        return value


def _fitted(kind: Literal["decimal", "text", "time"], limit: int = 0) -> Any:
    return Annotated[str | None, AfterValidator(Fit(kind, limit))]


Decimal = _fitted("decimal", 64)
Time = _fitted("time")
Text32 = _fitted("text", 32)
Text64 = _fitted("text", 64)
Text300 = _fitted("text", 300)
Text1024 = _fitted("text", 1024)
Text4096 = _fitted("text", 4096)
# int64 in the schema; the contract's parser has bounded them already.
Int = int | None


class _Fields(BaseModel):
    # strict: the record is typed already, so a wrong type here is a bug to see, not to coerce.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class CheckpointingStatus(_Fields):
    enabled: bool | None = None
    latestCheckpoint: Text4096 = None
    checkpointsCreated: Int = None
    latestCheckpointTime: Time = None
    lastSaveSeconds: Decimal = None
    lastStallSeconds: Decimal = None
    latestCheckpointReason: Text32 = None
    failedSaves: Int = None
    lastError: Text300 = None
    lastFailedStep: Int = None
    latestLocalCheckpoint: Text4096 = None
    localCheckpointsCreated: Int = None
    resumedTier: Text32 = None  # issue 28: "local (peer copy)" beside "local" and "persistent"


class RecordStatus(_Fields):
    """The status fields of one progress record (the rest of the status is the controller's)."""

    epoch: Int = None
    totalEpochs: Int = None
    step: Int = None
    totalSteps: Int = None
    loss: Decimal = None
    learningRate: Decimal = None
    percentComplete: Decimal = None
    estimatedTimeRemaining: Text64 = None
    stepSeconds: Decimal = None
    accuracy: Decimal = None
    validationLoss: Decimal = None
    validationAccuracy: Decimal = None
    resumedFrom: Text1024 = None
    lastUpdateTime: Time = None
    checkpointing: CheckpointingStatus | None = None


assert LATEST_CHECKPOINT_REASON in CheckpointingStatus.model_fields
assert RESUMED_TIER in CheckpointingStatus.model_fields

# What the record gives; the rest of the status (conditions, source, ...) is the controller's.
RECORD_KEYS = tuple(RecordStatus.model_fields)


def fits(model: type[BaseModel]) -> dict[str, Fit]:
    """Each fitted string field's rule, by field name (for tests and the schema check)."""
    out = {}
    for name, info in model.model_fields.items():
        for meta in info.metadata:
            if isinstance(getattr(meta, "func", None), Fit):
                out[name] = meta.func
    return out


def record_fields(record: ProgressRecord) -> dict[str, Any]:
    """The status fields a (validated) record gives, fitted to the schema."""
    data = record.to_dict()
    if not isinstance(data.get("checkpointing"), dict):
        data.pop("checkpointing", None)
    return RecordStatus.model_validate(data).model_dump(exclude_none=True)
