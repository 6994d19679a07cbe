"""The body of a progress push: Kubeflow Trainer's status protocol, or our own progress record.

Two shapes are accepted, both as strictly as a progress file (`contract.progress.parse_progress`:
size, UTF-8, JSON depth, no NaN/Infinity, counts within int64, decimals finite):

- Trainer's `UpdateTrainJobStatusRequest`, what transformers' `KubeflowCallback` POSTs:
  `{"trainerStatus": {"progressPercentage": int 0-100, "estimatedRemainingSeconds": int >= 0,
  "metrics": [{"name": str, "value": str}], "lastUpdatedTime": RFC 3339}}`. Its metrics named
  current_step, total_steps, current_epoch, loss, learning_rate, eval_loss, eval_accuracy become the
  record's fields; every other key anywhere is refused (a typo is an error, not silently lost).
- our own record (what trainer_runtime writes to the file), unchanged.

Either way the result is the `ProgressRecord` the file path would have produced, so the controller
decides from it exactly as from an exec read. Strings with control characters are refused (no
legitimate progress value has one; a status or an Event would carry it to every reader).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from trainer_runtime.contract.errors import ContractError
from trainer_runtime.contract.progress import (
    MAX_COUNT,
    MAX_NESTING,
    MAX_PROGRESS_BYTES,
    ProgressRecord,
    format_rfc3339,
    json_nesting,
    parse_progress,
    parse_rfc3339,
    reject_json_constant,
)

TRAINER_STATUS: Final = "trainerStatus"
MAX_METRICS: Final = 64
MAX_METRIC_TEXT: Final = 256
_INT32_MAX: Final = 2**31 - 1  # Trainer's estimatedRemainingSeconds / progressPercentage are int32
_TRAINER_KEYS: Final = frozenset(
    {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_INT_RE = re.compile(r"[0-9]{1,19}")
# Trainer metric name -> (record key, how the value is read).
_METRIC_FIELDS: Final = {
    "current_step": ("step", "count"),
    "total_steps": ("totalSteps", "count"),
    "current_epoch": ("epoch", "epoch"),
    "loss": ("loss", "decimal"),
    "learning_rate": ("learningRate", "decimal"),
    "eval_loss": ("validationLoss", "decimal"),
    "eval_accuracy": ("validationAccuracy", "decimal"),
}


class PushBodyError(ValueError):
    """A body that is not a valid push; the message names the field."""


def _no_control(value: Any, path: str) -> None:
    if isinstance(value, str):
        if _CONTROL.search(value):
            raise PushBodyError(f"{path}: control characters are not allowed")
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_control(k, f"{path}.{k!r}")
            _no_control(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _no_control(v, f"{path}[{i}]")


def _int(value: Any, path: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PushBodyError(f"{path}: expected an integer")
    if not 0 <= value <= high:
        raise PushBodyError(f"{path}: must be between 0 and {high}, got {value}")
    return value


def _metric_value(name: str, value: str, how: str) -> Any:
    path = f"trainerStatus.metrics[{name}]"
    if how == "count":
        if not _INT_RE.fullmatch(value) or int(value) > MAX_COUNT:
            raise PushBodyError(f"{path}: expected a non-negative integer, got {value!r}")
        return int(value)
    try:
        number = float(value)
    except ValueError:
        raise PushBodyError(f"{path}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise PushBodyError(f"{path}: expected a finite number, got {value!r}")
    if how == "epoch":  # KubeflowCallback sends round(epoch, 2); the record counts whole epochs
        if not 0 <= number <= MAX_COUNT:
            raise PushBodyError(f"{path}: must be >= 0, got {value!r}")
        return int(number)
    return value  # the record checks the decimal's form


def trainer_record(status: Any) -> dict[str, Any]:
    """Trainer's `trainerStatus` as a progress record's JSON object (not yet validated)."""
    if not isinstance(status, dict):
        raise PushBodyError("trainerStatus: expected an object")
    unknown = sorted(set(status) - _TRAINER_KEYS)
    if unknown:
        raise PushBodyError(f"trainerStatus: unknown field(s) {', '.join(map(repr, unknown))}")
    out: dict[str, Any] = {}
    if "progressPercentage" in status:
        pct = _int(status["progressPercentage"], "trainerStatus.progressPercentage", 100)
        out["percentComplete"] = str(pct)
    if "estimatedRemainingSeconds" in status:
        path = "trainerStatus.estimatedRemainingSeconds"
        eta = _int(status["estimatedRemainingSeconds"], path, _INT32_MAX)
        out["estimatedTimeRemaining"] = f"{eta}s"
    if "lastUpdatedTime" in status:
        t = status["lastUpdatedTime"]
        try:
            out["lastUpdateTime"] = format_rfc3339(parse_rfc3339(t))
        except ContractError:
            raise PushBodyError(
                f"trainerStatus.lastUpdatedTime: expected an RFC 3339 timestamp, got {t!r}"
            ) from None
    metrics = status.get("metrics", [])
    if not isinstance(metrics, list):
        raise PushBodyError("trainerStatus.metrics: expected an array")
    if len(metrics) > MAX_METRICS:
        raise PushBodyError(f"trainerStatus.metrics: more than {MAX_METRICS} items")
    for i, m in enumerate(metrics):
        path = f"trainerStatus.metrics[{i}]"
        if not isinstance(m, dict) or set(m) != {"name", "value"}:
            raise PushBodyError(f"{path}: expected an object with exactly name and value")
        name, value = m["name"], m["value"]
        if not isinstance(name, str) or not isinstance(value, str):
            raise PushBodyError(f"{path}: name and value must be strings")
        if not name or len(name) > MAX_METRIC_TEXT or len(value) > MAX_METRIC_TEXT:
            raise PushBodyError(f"{path}: name (non-empty) and value at most {MAX_METRIC_TEXT}")
        if name in _METRIC_FIELDS:
            key, how = _METRIC_FIELDS[name]
            out[key] = _metric_value(name, value, how)
    return out


def _load(data: bytes) -> Any:
    """JSON with the file path's guards: size, UTF-8, depth, no NaN/Infinity constants."""
    if len(data) > MAX_PROGRESS_BYTES:
        raise PushBodyError(f"the body is over the limit of {MAX_PROGRESS_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PushBodyError(f"the body is not valid UTF-8: {e}") from None
    if json_nesting(text) > MAX_NESTING:
        raise PushBodyError(f"the body is nested over {MAX_NESTING} deep")
    try:
        return json.loads(text, parse_constant=reject_json_constant)
    except (ContractError, ValueError, RecursionError) as e:
        raise PushBodyError(f"the body is not valid JSON: {e}") from None


def parse_push(data: bytes) -> ProgressRecord | None:
    """The record a push carries; PushBodyError (400) for anything a progress file would not pass,
    an unknown field of Trainer's shape, or a control character. None for a Trainer body with no
    step (KubeflowCallback's first, at train begin): valid, but nothing to record."""
    obj = _load(data)
    if not isinstance(obj, dict):
        raise PushBodyError("the body must be a JSON object")
    _no_control(obj, "body")
    if TRAINER_STATUS not in obj:
        try:
            return parse_progress(data)  # exactly the file's validation
        except ContractError as e:
            raise PushBodyError(str(e).replace("progress file", "push body")) from None
    if set(obj) != {TRAINER_STATUS}:
        extra = sorted(set(obj) - {TRAINER_STATUS})
        raise PushBodyError(f"unknown field(s) beside trainerStatus: {', '.join(map(repr, extra))}")
    fields = trainer_record(obj[TRAINER_STATUS])
    if "step" not in fields:
        return None
    try:
        return ProgressRecord.from_dict(fields)
    except ContractError as e:
        raise PushBodyError(f"trainerStatus: {e}") from None
