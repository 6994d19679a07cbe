"""The progress record rank 0 writes to $TRAINING_PROGRESS_FILE (DESIGN.md, "Progress file").

The runtime writes it, the reconciler reads it (`cat` in the pod, or the termination message), so
both go through this module. Non-count numbers are strings, as Kubernetes API conventions avoid
floats; counts are integers. Unknown keys are kept so that to_dict(parse(x)) == x: a newer writer
never loses data through an older reader.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final

from .env import parse_duration
from .errors import ContractError, describe

MAX_PROGRESS_BYTES: Final = 64 * 1024
TERMINATION_MESSAGE_LIMIT: Final = 4096  # the kubelet truncates /dev/termination-log beyond this
MAX_STRING_LENGTH: Final = 1024
MAX_COUNT: Final = 2**63 - 1  # int64, what the TrainingProgress status schema stores

# Field kinds, each with one validation rule.
_COUNT = "count"  # int >= 0, not bool
_DECIMAL = "decimal"  # string holding a finite decimal number
_NN_DECIMAL = "non-negative decimal"  # the same, >= 0 (durations, percentages)
_TIME = "time"  # RFC 3339 string
_TEXT = "text"  # any string
_BOOL = "bool"

# (JSON key, attribute, kind) in the order DESIGN.md lists them; to_dict emits this order.
_RECORD_FIELDS: Final = (
    ("epoch", "epoch", _COUNT),
    ("totalEpochs", "total_epochs", _COUNT),
    ("step", "step", _COUNT),
    ("totalSteps", "total_steps", _COUNT),
    ("loss", "loss", _DECIMAL),
    ("learningRate", "learning_rate", _DECIMAL),
    ("percentComplete", "percent_complete", _NN_DECIMAL),
    ("estimatedTimeRemaining", "estimated_time_remaining", _TEXT),
    ("stepSeconds", "step_seconds", _NN_DECIMAL),
    ("lastUpdateTime", "last_update_time", _TIME),
    ("resumedFrom", "resumed_from", _TEXT),
    ("accuracy", "accuracy", _DECIMAL),
    ("validationLoss", "validation_loss", _DECIMAL),
    ("validationAccuracy", "validation_accuracy", _DECIMAL),
    # Which training process wrote the record: an id the runtime draws once per process, so the
    # controller tells a new process (a restart, a preemption) from a re-read of the same one and
    # carries the job's life-long counts forward (progress_controller/lifetime.py).
    ("incarnation", "incarnation", _TEXT),
)
# An incarnation id is short (the runtime writes 32 hex digits); the controller keeps this much.
MAX_INCARNATION_LENGTH: Final = 64
_CHECKPOINTING_FIELDS: Final = (
    ("enabled", "enabled", _BOOL),
    ("latestCheckpoint", "latest_checkpoint", _TEXT),
    ("checkpointsCreated", "checkpoints_created", _COUNT),
    ("latestCheckpointTime", "latest_checkpoint_time", _TIME),
    ("lastSaveSeconds", "last_save_seconds", _NN_DECIMAL),
    ("lastStallSeconds", "last_stall_seconds", _NN_DECIMAL),
    # Failure accounting (issue 17): a save that failed, or a stop that could not save, is counted
    # and explained here, so `kubectl describe tp` says why no checkpoint appeared.
    ("failedSaves", "failed_saves", _COUNT),
    ("lastError", "last_error", _TEXT),
    ("lastFailedStep", "last_failed_step", _COUNT),
    # The ramdisk tier: per node, so it is never `latestCheckpoint` (which must survive the node).
    ("latestLocalCheckpoint", "latest_local_checkpoint", _TEXT),
    ("localCheckpointsCreated", "local_checkpoints_created", _COUNT),
)
# lastError is cut to this many characters by the runtime (a traceback is not a status).
MAX_ERROR_LENGTH: Final = 300
# An extension key of `checkpointing` (readers keep unknown keys, so older readers are unaffected):
# why the latest checkpoint exists, so the reconciler names its Event from the record rather than
# guessing from how it read it (a JIT save's record is often read by exec before the exit).
LATEST_CHECKPOINT_REASON: Final = "latestCheckpointReason"
REASON_PERIODIC: Final = "periodic"
REASON_JIT: Final = "jit"  # saved because of SIGTERM or the preStop request
REASON_RESUME: Final = "resume"  # the checkpoint this process resumed from, nothing new
# An extension key of `checkpointing` too: set when restore found checkpoints of which none
# verifies (or one of a newer format): {"reason": ..., "message": naming them and why}; the
# controller shows it as the TrainingProgress condition CheckpointsUnverifiable (docs/contract.md).
UNVERIFIABLE_CHECKPOINTS: Final = "unverifiableCheckpoints"
# An extension key of `checkpointing` (issue 28): the tier the process resumed from, "local",
# "persistent" or "local (peer copy)" (a node's part fetched from its ring successor's copy).
RESUMED_TIER: Final = "resumedTier"
_RECORD_KEYS: Final = frozenset(k for k, _, _ in _RECORD_FIELDS) | {"checkpointing"}
_CHECKPOINTING_KEYS: Final = frozenset(k for k, _, _ in _CHECKPOINTING_FIELDS)

# What the termination message gives up first when it is over 4 KiB, after the extra keys: what
# matters least once the job has ended goes first; what says where to resume goes last.
_SHORT_FORM_DROP_ORDER: Final = (
    ("checkpointing", "localCheckpointsCreated"),
    ("checkpointing", "latestLocalCheckpoint"),
    ("checkpointing", "lastFailedStep"),
    ("checkpointing", "failedSaves"),
    ("checkpointing", "lastError"),
    ("resumedFrom",),
    ("estimatedTimeRemaining",),
    ("validationAccuracy",),
    ("validationLoss",),
    ("accuracy",),
    ("learningRate",),
    ("checkpointing", "lastStallSeconds"),
    ("checkpointing", "latestCheckpointTime"),
    ("stepSeconds",),
    ("checkpointing", "lastSaveSeconds"),
    ("loss",),
    ("percentComplete",),
    ("lastUpdateTime",),
    ("incarnation",),
    ("checkpointing", "latestCheckpoint"),
    ("checkpointing",),
)

_DECIMAL_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_RFC3339_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)


def json_type(value: object) -> str:
    """The JSON name of a Python value's type, for messages a YAML/JSON author understands."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 timestamp ("2024-01-15T10:30:00Z") as an aware datetime; ContractError if not."""
    m = _RFC3339_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ContractError(f"expected an RFC 3339 timestamp, got {describe(text)}")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    frac = m.group(7)
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    if m.group(8):
        tz = UTC
    else:
        off_h, off_m = int(m.group(10)), int(m.group(11))
        if off_h > 23 or off_m > 59:
            raise ContractError(f"expected an RFC 3339 timestamp, got {describe(text)}")
        offset = timedelta(hours=off_h, minutes=off_m)
        tz = timezone(-offset if m.group(9) == "-" else offset)
    try:
        # RFC 3339 allows a leap second (:60); datetime does not, so read it as :59.
        moment = datetime(year, month, day, hour, minute, min(second, 59), micro, tzinfo=tz)
        # Every reader converts to UTC: a time with no UTC form (year 1 at +01:00) is refused
        # here rather than raising OverflowError in the controller.
        moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ContractError(f"expected an RFC 3339 timestamp, got {describe(text)}") from None
    return moment


def format_rfc3339(moment: datetime | None = None) -> str:
    """`moment` (default: now) in UTC as "YYYY-MM-DDTHH:MM:SSZ", the form the writers use."""
    t = datetime.now(UTC) if moment is None else moment.astimezone(UTC)
    # Not strftime: glibc writes year 10 as "10", which the API server refuses as a date-time.
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}Z"


def format_decimal(value: float, places: int = 4) -> str:
    """A float as the fixed-point string a progress field holds ("0.4523"); rejects NaN/inf."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ContractError(f"expected a finite number, got {describe(value)}")
    return f"{value:.{places}f}"


def _check(path: str, kind: str, value: object) -> None:
    """Raise ContractError naming `path` unless `value` is a valid `kind` value."""
    if kind == _COUNT:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ContractError(f"{path}: expected integer, got {json_type(value)}", field=path)
        if not 0 <= value <= MAX_COUNT:
            raise ContractError(
                f"{path}: must be between 0 and {MAX_COUNT}, got {describe(value)}", field=path
            )
        return
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise ContractError(f"{path}: expected boolean, got {json_type(value)}", field=path)
        return
    if not isinstance(value, str):
        raise ContractError(f"{path}: expected string, got {json_type(value)}", field=path)
    if len(value) > MAX_STRING_LENGTH:
        raise ContractError(
            f"{path}: string of {len(value)} characters exceeds the limit of {MAX_STRING_LENGTH}",
            field=path,
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ContractError(f"{path}: string is not valid Unicode", field=path) from None
    if kind in (_DECIMAL, _NN_DECIMAL):
        number = float(value) if _DECIMAL_RE.fullmatch(value) else math.nan
        if not math.isfinite(number):
            raise ContractError(
                f"{path}: expected a finite decimal number in a string, got {describe(value)}",
                field=path,
            )
        if kind == _NN_DECIMAL and number < 0:
            raise ContractError(f"{path}: must be >= 0, got {describe(value)}", field=path)
    elif kind == _TIME:
        try:
            parse_rfc3339(value)
        except ContractError:
            raise ContractError(
                f"{path}: expected an RFC 3339 timestamp, got {describe(value)}", field=path
            ) from None


def _check_extra(path: str, extra: object, known: frozenset[str]) -> None:
    if not isinstance(extra, dict):
        raise ContractError(f"{path}: expected a dict, got {json_type(extra)}", field=path)
    for key in extra:
        if not isinstance(key, str):
            raise ContractError(f"{path}: keys must be strings, got {describe(key)}", field=path)
        if key in known:
            # Otherwise to_dict would have two values for one key.
            raise ContractError(f"{path}: {key!r} is a known field, set it directly", field=path)


def _to_float(value: str | None) -> float | None:
    return None if value is None else float(value)


def _parse_time(value: str | None) -> datetime | None:
    return None if value is None else parse_rfc3339(value)


def _dumps_compact(obj: object) -> str:
    # ASCII-only output, so its length in characters is its length in bytes.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclass
class CheckpointingStatus:
    """The record's `checkpointing` object. Every field is optional."""

    enabled: bool | None = None
    latest_checkpoint: str | None = None
    checkpoints_created: int | None = None
    latest_checkpoint_time: str | None = None  # RFC 3339
    last_save_seconds: str | None = None  # decimal string
    last_stall_seconds: str | None = None  # decimal string
    failed_saves: int | None = None
    last_error: str | None = None
    last_failed_step: int | None = None
    latest_local_checkpoint: str | None = None
    local_checkpoints_created: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, prefix: str = "checkpointing.") -> None:
        for key, attr, kind in _CHECKPOINTING_FIELDS:
            value = getattr(self, attr)
            if value is not None:
                _check(prefix + key, kind, value)
        _check_extra(prefix + "extra", self.extra, _CHECKPOINTING_KEYS)

    @classmethod
    def from_dict(cls, data: object, path: str = "checkpointing") -> CheckpointingStatus:
        if not isinstance(data, dict):
            raise ContractError(f"{path}: expected object, got {json_type(data)}", field=path)
        kwargs: dict[str, Any] = {}
        for key, attr, kind in _CHECKPOINTING_FIELDS:
            if key in data:
                _check(f"{path}.{key}", kind, data[key])
                kwargs[attr] = data[key]
        extra = {k: v for k, v in data.items() if k not in _CHECKPOINTING_KEYS}
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        self.validate()
        out: dict[str, Any] = {}
        for key, attr, _ in _CHECKPOINTING_FIELDS:
            value = getattr(self, attr)
            if value is not None:
                out[key] = value
        out.update(self.extra)
        return out

    def last_save_seconds_value(self) -> float | None:
        return _to_float(self.last_save_seconds)

    def last_stall_seconds_value(self) -> float | None:
        return _to_float(self.last_stall_seconds)

    def latest_checkpoint_time_value(self) -> datetime | None:
        return _parse_time(self.latest_checkpoint_time)


@dataclass
class ProgressRecord:
    """One progress record. Only `step` is required; None means "absent from the file"."""

    step: int
    epoch: int | None = None
    total_epochs: int | None = None
    total_steps: int | None = None
    loss: str | None = None
    learning_rate: str | None = None
    percent_complete: str | None = None
    estimated_time_remaining: str | None = None  # free text such as "45m"; see eta_seconds()
    step_seconds: str | None = None  # smoothed seconds per optimizer step
    last_update_time: str | None = None  # RFC 3339
    resumed_from: str | None = None
    accuracy: str | None = None
    validation_loss: str | None = None
    validation_accuracy: str | None = None
    incarnation: str | None = None  # the writing process's id (one per process start)
    checkpointing: CheckpointingStatus | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ContractError naming the field if a value breaks the contract (after mutation)."""
        for key, attr, kind in _RECORD_FIELDS:
            value = getattr(self, attr)
            if value is not None or key == "step":
                _check(key, kind, value)
        if self.checkpointing is not None:
            if not isinstance(self.checkpointing, CheckpointingStatus):
                raise ContractError(
                    "checkpointing: expected CheckpointingStatus, "
                    f"got {describe(self.checkpointing)}",
                    field="checkpointing",
                )
            self.checkpointing.validate()
        _check_extra("extra", self.extra, _RECORD_KEYS)

    @classmethod
    def from_dict(cls, data: object) -> ProgressRecord:
        """Validate a decoded JSON object; errors name the field path."""
        if not isinstance(data, dict):
            raise ContractError(f"progress record must be a JSON object, got {json_type(data)}")
        if "step" not in data:
            raise ContractError("step: required field is missing", field="step")
        kwargs: dict[str, Any] = {}
        for key, attr, kind in _RECORD_FIELDS:
            if key in data:
                _check(key, kind, data[key])
                kwargs[attr] = data[key]
        if "checkpointing" in data:
            kwargs["checkpointing"] = CheckpointingStatus.from_dict(data["checkpointing"])
        extra = {k: v for k, v in data.items() if k not in _RECORD_KEYS}
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: known fields in DESIGN.md order, then the extra keys."""
        self.validate()
        out: dict[str, Any] = {}
        for key, attr, _ in _RECORD_FIELDS:
            value = getattr(self, attr)
            if value is not None:
                out[key] = value
        if self.checkpointing is not None:
            out["checkpointing"] = self.checkpointing.to_dict()
        out.update(self.extra)
        return out

    def to_json(self, *, indent: int | None = None) -> str:
        """The file's content. Non-ASCII is kept as is (UTF-8 when written), so size stays small."""
        data = self.to_dict()  # validates: its ContractError must not be reworded below
        try:
            return json.dumps(data, indent=indent, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ContractError(f"extra: value is not JSON-serialisable: {e}", field="extra") from e

    # --- the short form for /dev/termination-log ---

    def _short_dict(self, limit: int) -> dict[str, Any]:
        try:
            d = self.to_dict()
            size = len(_dumps_compact(d))
        except (TypeError, ValueError):
            # Extras that cannot be serialised are dropped rather than losing the whole record.
            d = self.to_dict()
            d = {k: v for k, v in d.items() if k in _RECORD_KEYS}
            if "checkpointing" in d:
                d["checkpointing"] = {
                    k: v for k, v in d["checkpointing"].items() if k in _CHECKPOINTING_KEYS
                }
            size = len(_dumps_compact(d))
        if size <= limit:
            return d
        # Extra keys go first (both levels pooled), largest first, so small ones survive. Sizes are
        # tracked arithmetically: re-serialising after every drop would be quadratic in the keys.
        candidates: list[tuple[int, int, dict[str, Any], str]] = []
        ckpt = d.get("checkpointing")
        for level, (container, known) in enumerate(
            ((d, _RECORD_KEYS), (ckpt, _CHECKPOINTING_KEYS))
        ):
            if isinstance(container, dict):
                candidates.extend(
                    # key, colon, value and one comma
                    (len(_dumps_compact(k)) + 2 + len(_dumps_compact(v)), level, container, k)
                    for k, v in container.items()
                    if k not in known
                )
        candidates.sort(key=lambda c: (-c[0], c[1], c[3]))
        estimate = size
        for entry_size, _, container, key in candidates:
            if estimate <= limit:
                # The estimate can be a byte low (a dict's last entry has no comma): check exactly.
                size = len(_dumps_compact(d))
                if size <= limit:
                    return d
                estimate = size
            del container[key]
            estimate -= entry_size
        if len(_dumps_compact(d)) <= limit:
            return d
        for path in _SHORT_FORM_DROP_ORDER:
            parent: Any = d
            for key in path[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if isinstance(parent, dict) and path[-1] in parent:
                del parent[path[-1]]
                if len(_dumps_compact(d)) <= limit:
                    return d
        # Only the four counts are left, at most about 130 bytes: always within any sane limit.
        return d

    def to_termination_message(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """Compact ASCII JSON of this record, dropping extras and optional fields until it fits
        `limit` bytes (4 KiB, the kubelet's cap for /dev/termination-log). `step` is always kept.
        """
        text = _dumps_compact(self._short_dict(limit))
        if len(text) > limit:
            raise ContractError(f"termination message cannot fit {limit} bytes")
        return text

    def short_form(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> ProgressRecord:
        """The record the termination message holds, as a ProgressRecord."""
        return ProgressRecord.from_dict(self._short_dict(limit))

    # --- typed views of the string fields ---

    def loss_value(self) -> float | None:
        return _to_float(self.loss)

    def learning_rate_value(self) -> float | None:
        return _to_float(self.learning_rate)

    def percent_complete_value(self) -> float | None:
        return _to_float(self.percent_complete)

    def step_seconds_value(self) -> float | None:
        return _to_float(self.step_seconds)

    def accuracy_value(self) -> float | None:
        return _to_float(self.accuracy)

    def validation_loss_value(self) -> float | None:
        return _to_float(self.validation_loss)

    def validation_accuracy_value(self) -> float | None:
        return _to_float(self.validation_accuracy)

    def last_update_time_value(self) -> datetime | None:
        return _parse_time(self.last_update_time)

    def eta_seconds(self) -> float | None:
        """estimatedTimeRemaining in seconds when it is plain seconds or a Go duration, else None.

        The field is free text in the file (writers other than ours may put anything there), so an
        unreadable value is not an error, just unknown.
        """
        text = self.estimated_time_remaining
        if text is None:
            return None
        if _DECIMAL_RE.fullmatch(text):
            value = float(text)
        else:
            try:
                value = parse_duration(text)
            except ContractError:
                return None
        return value if math.isfinite(value) and value >= 0 else None


def reject_json_constant(name: str) -> Any:
    """`json.loads(..., parse_constant=)`: NaN and Infinity are not JSON (the push endpoint's
    body parser uses it too)."""
    raise ContractError(f"progress file is not valid JSON: {name} is not allowed")


# A record is two levels deep (`checkpointing`); anything much deeper is not a progress record.
MAX_NESTING = 32


def json_nesting(text: str) -> int:
    """How deep arrays and objects nest in `text` (JSON), brackets inside strings not counted;
    checked before `json.loads` (here and by the push endpoint), whose recursion it bounds."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return 0  # cannot be deeper: the common case costs two counts
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_progress(data: bytes | bytearray | memoryview | str) -> ProgressRecord:
    """Parse and validate a progress file's content (or a termination message).

    Raises ContractError for input over MAX_PROGRESS_BYTES, invalid UTF-8, invalid JSON, JSON that
    is not an object, and any field of the wrong type or form (the message names the field path).
    """
    if isinstance(data, str):
        size = len(data.encode("utf-8", "surrogatepass"))
    elif isinstance(data, bytes | bytearray | memoryview):
        size = memoryview(data).nbytes
    else:
        raise ContractError(f"progress data must be bytes or str, got {type(data).__name__}")
    if size > MAX_PROGRESS_BYTES:
        raise ContractError(
            f"progress file is {size} bytes, over the limit of {MAX_PROGRESS_BYTES} bytes"
        )
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ContractError(f"progress file is not valid UTF-8: {e}") from None
    if json_nesting(text) > MAX_NESTING:
        # Checked here, not left to json's RecursionError: that depends on the interpreter's
        # recursion limit, which other code (hypothesis, for one) raises for a while.
        raise ContractError(f"progress file is not valid JSON: nested over {MAX_NESTING} deep")
    try:
        obj = json.loads(text, parse_constant=reject_json_constant)
    except json.JSONDecodeError as e:
        raise ContractError(f"progress file is not valid JSON: {e}") from None
    except RecursionError:
        raise ContractError("progress file is not valid JSON: nested too deeply") from None
    except ContractError:
        raise
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        raise ContractError(f"progress file is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ContractError(f"progress file must hold a JSON object, got {json_type(obj)}")
    try:
        # A "\ud800" escape decodes to a lone surrogate, which no UTF-8 writer can write back.
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ContractError("progress file holds a string that is not valid Unicode") from None
    except RecursionError:
        raise ContractError("progress file is not valid JSON: nested too deeply") from None
    return ProgressRecord.from_dict(obj)
