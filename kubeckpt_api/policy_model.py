"""The CheckpointPolicy schema as pydantic models: what the webhook accepts, field by field.

The API server has already validated, defaulted and pruned a CheckpointPolicy against the CRD
(config/crd/bases/kubeckpt.io_checkpointpolicies.yaml), so these models mostly re-state it; they
exist because the webhook must also cope with objects that did not pass through that schema (an
older CRD version, a test, a hostile or corrupted cache) and must then fail with one clear line,
never with a traceback in the admission path. Per-job override annotations have no schema on the
API server side at all: `Overrides` is their only validation.

Validation errors leave this module only as ContractError (a ValueError) with a one-line message
that starts with the field's path: `contract_error` turns pydantic's ValidationError into that.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal

from kubernetes.utils import parse_quantity as k8s_parse_quantity
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, model_validator
from pydantic_core import ErrorDetails

from trainer_runtime.contract import STRATEGIES, ContractError, parse_duration
from trainer_runtime.contract.errors import describe

DEFAULT_MOUNT_PATH = "/mnt/kubeckpt"
MIN_GRACE_SECONDS = 30
MAX_GRACE_SECONDS = 86400
# The CRD's integers are int64; Go's time.Duration (what the CRD's duration() checks) is int64 ns.
INT64_MAX = 2**63 - 1
MAX_DURATION_SECONDS = INT64_MAX / 1e9
# Decimal digits before a quantity counts as absurd. Far above any real size, and a bound is
# needed: rounding 1e999999999 up to whole bytes builds a billion-digit int and never returns.
MAX_QUANTITY_EXPONENT = 63

# --- value parsers, shared by the policy spec and the annotations so both say the same ---------


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity such as 64Gi, 500M, 1e9 or 1073741824 (the official
    client's parser: exact decimals, every suffix and exponent form the API server accepts)."""
    try:
        value = k8s_parse_quantity(text.strip())
    # ArithmeticError: decimal.InvalidOperation, for forms the parser does not expect
    except (ValueError, ArithmeticError, TypeError, AttributeError) as e:
        raise ValueError(f"not a quantity: {describe(text)}") from e
    # The parser takes "NaN" and "Infinity" too (Decimal does); neither is a size.
    if not isinstance(value, Decimal) or not value.is_finite():
        raise ValueError(f"not a quantity: {describe(text)}")
    if value <= 0:
        raise ValueError(f"must be positive: {describe(text)}")
    if value.adjusted() > MAX_QUANTITY_EXPONENT:
        raise ValueError(f"too large: {describe(text)}")
    return math.ceil(value)


def _quantity(value: object) -> str:
    """A positive quantity, as the text to put into the pod (the CRD allows int or string)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"not a quantity: {_brief(value)}")
    parse_quantity(value)
    return value.strip()


def _positive_int(value: object) -> int:
    """A JSON integer, or decimal digits (annotations are strings), in 1..2^63-1."""
    if isinstance(value, str):
        text = value.strip()
        # isdigit() (the old check) took superscripts, which int() refuses; isdecimal() alone
        # takes other scripts' digits
        if not (text.isascii() and text.isdecimal()) or len(text) > 32:
            raise ValueError("expected a positive integer")
        n = int(text)
    elif isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        raise ValueError("expected a positive integer")
    if not 1 <= n <= INT64_MAX:
        raise ValueError("expected a positive integer")
    return n


def _grace(value: object) -> int:
    n = _positive_int(value)
    if not MIN_GRACE_SECONDS <= n <= MAX_GRACE_SECONDS:
        raise ValueError(f"expected {MIN_GRACE_SECONDS}..{MAX_GRACE_SECONDS}")
    return n


def _bool(value: object) -> bool:
    """A JSON boolean, or the words an annotation may use for one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "yes", "1"):
            return True
        if low in ("false", "no", "0"):
            return False
    raise ValueError("expected true or false")


def _strategy(value: object) -> str:
    if not isinstance(value, str) or value not in STRATEGIES:
        raise ValueError(f"expected one of {', '.join(STRATEGIES)}")
    return value


def _interval_seconds(value: object) -> int:
    """Whole seconds of a Go duration (5m, 1h30m), or of bare digits (seconds), in 1s..Go's max."""
    if not isinstance(value, str):
        raise ValueError(f"expected a duration string such as 5m, got {_brief(value)}")
    text = value.strip()
    # isdecimal alone takes other scripts' digits, which float() may refuse
    seconds = float(text) if text.isascii() and text.isdecimal() else parse_duration(text)
    if not seconds >= 1:
        raise ValueError(f"must be at least 1s, got {describe(value)}")
    if seconds > MAX_DURATION_SECONDS:  # float("9" * 400) is inf: ceil() would raise
        raise ValueError(f"must be at most {int(MAX_DURATION_SECONDS)}s, got {describe(value)}")
    return math.ceil(seconds)


def _mount_path(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a path, got {_brief(value)}")
    # "" is what an unset field looked like to the hand-written parser: the default
    return (value or DEFAULT_MOUNT_PATH).rstrip("/") or "/"


def _brief(value: object) -> str:
    """A bad input for a message: scalars as repr (cut short), containers by kind only (a repr
    of deeply nested junk can be huge or hit the recursion limit)."""
    if value is None or isinstance(value, str | int | float | bool):
        return describe(value)
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


PositiveInt = Annotated[int, PlainValidator(_positive_int)]
Bool = Annotated[bool, PlainValidator(_bool)]
# The override fields: PlainValidator replaces validation, so `| None` is only for the default.
OptInt = Annotated[int | None, PlainValidator(_positive_int)]
OptBool = Annotated[bool | None, PlainValidator(_bool)]

# --- the CheckpointPolicy object -------------------------------------------------------------


class _Schema(BaseModel):
    """Frozen, unknown fields ignored (the API server has pruned them; metadata has many we do not
    need), and a null treated as an absent field (the API server prunes nulls of fields that are
    not nullable before defaulting, so this is what it would have stored)."""

    # protected_namespaces: pydantic before 2.10 reserves all of `model_` (modelParameters is
    # model_parameters here) and warns; later ones reserve only its own method names.
    model_config = ConfigDict(extra="ignore", frozen=True, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if type(data) is dict and None not in data.values():
            return data  # the usual case, checked first: this runs for every nested object
        if isinstance(data, Mapping):
            return {k: v for k, v in data.items() if v is not None}
        return data


class SecretRef(_Schema):
    # Required by the CRD; optional here as before (an empty secretRef means no Secret).
    name: str | None = None


class Storage(_Schema):
    uri: Annotated[str, Field(min_length=1)]
    mount_path: Annotated[str, PlainValidator(_mount_path)] = Field(
        DEFAULT_MOUNT_PATH, alias="mountPath"
    )
    secret_ref: SecretRef | None = Field(None, alias="secretRef")


class Jit(_Schema):
    enabled: Bool = True
    max_grace_period_seconds: Annotated[int, PlainValidator(_grace)] = Field(
        300, alias="maxGracePeriodSeconds"
    )


class LocalTier(_Schema):
    enabled: Bool = False
    size_limit: Annotated[str | None, PlainValidator(_quantity)] = Field(None, alias="sizeLimit")
    model_parameters: OptInt = Field(None, alias="modelParameters")
    period_steps: PositiveInt = Field(100, alias="periodSteps")
    # issue 28: each node's local checkpoint is also kept in its ring successor's ramdisk.
    peer_copy: Bool = Field(False, alias="peerCopy")


class Progress(_Schema):
    update_every_steps: PositiveInt = Field(5, alias="updateEverySteps")
    push: Bool = False  # issue 26: the pod also pushes its progress (progress_controller/push.py)


class Instrumentation(_Schema):
    auto: Bool = False


class LabelSelectorRequirement(_Schema):
    key: Annotated[str, Field(min_length=1)]
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class Selector(_Schema):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, alias="matchExpressions"
    )


class CheckpointPolicySpec(_Schema):
    """spec of a CheckpointPolicy, with the CRD's defaults (DESIGN.md, section "API")."""

    storage: Storage
    selector: Selector | None = None
    # 300: the CRD's default, 5m
    interval_seconds: Annotated[int, PlainValidator(_interval_seconds)] = Field(
        300, alias="interval"
    )
    strategy: Annotated[str, PlainValidator(_strategy)] = "time"
    save_steps: OptInt = Field(None, alias="saveSteps")
    max_checkpoints: PositiveInt = Field(3, alias="maxCheckpoints")
    resume: Bool = True
    # An extension (docs/contract.md): what a resuming pod does when checkpoints exist but none
    # verifies. Fail (absent: the CRD sets no default, as DESIGN.md lists every default) stops it.
    on_unverifiable_checkpoints: Literal["Fail", "StartFresh"] = Field(
        "Fail", alias="onUnverifiableCheckpoints"
    )
    jit: Jit = Field(default_factory=Jit)
    local_tier: LocalTier = Field(default_factory=LocalTier, alias="localTier")
    progress: Progress = Field(default_factory=Progress)
    instrumentation: Instrumentation = Field(default_factory=Instrumentation)


class ObjectMeta(_Schema):
    name: str = ""
    namespace: str = ""
    creation_timestamp: str = Field("", alias="creationTimestamp")


class CheckpointPolicy(_Schema):
    """The parts of a CheckpointPolicy object the webhook reads (apiVersion, kind, status and
    the rest of metadata are ignored)."""

    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: CheckpointPolicySpec


# --- per-job override annotations ------------------------------------------------------------


class Overrides(_Schema):
    """The `kubeckpt.io/<alias>` annotations a pod may set, each a string; the field names are the
    Policy attributes they replace. Only the annotations present are set (model_fields_set)."""

    interval_seconds: Annotated[int | None, PlainValidator(_interval_seconds)] = Field(
        None, alias="interval"
    )
    strategy: Annotated[str | None, PlainValidator(_strategy)] = None
    save_steps: OptInt = Field(None, alias="save-steps")
    max_checkpoints: OptInt = Field(None, alias="max-checkpoints")
    resume: OptBool = None
    jit: OptBool = None
    max_grace_seconds: Annotated[int | None, PlainValidator(_grace)] = Field(
        None, alias="max-grace-period-seconds"
    )
    local_enabled: OptBool = Field(None, alias="local-tier")
    local_size_limit: Annotated[str | None, PlainValidator(_quantity)] = Field(
        None, alias="local-size-limit"
    )
    local_period_steps: OptInt = Field(None, alias="local-period-steps")
    local_model_parameters: OptInt = Field(None, alias="model-parameters")
    progress_every_steps: OptInt = Field(None, alias="progress-every-steps")
    auto_instrumentation: OptBool = Field(None, alias="instrumentation-auto")


# annotation suffix -> the Policy attribute it overrides
OVERRIDES: dict[str, str] = {
    str(f.alias or name): name for name, f in Overrides.model_fields.items()
}

# --- ValidationError -> one line -------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")
# pydantic's messages for type errors name our classes ("a valid dictionary or instance of Jit")
_EXPECTED = {
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "dict_type": "expected an object",
    "list_type": "expected a list",
    "string_type": "expected a string",
}
# an empty string where the CRD has minLength 1 is as good as none
_REQUIRED = ("missing", "string_too_short")
_MAX_MESSAGE = 400


def error_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the field path a user writes: spec.jit.enabled, x[0]."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:  # a map key (matchLabels) or a pydantic tag; quoted so it cannot break the line
            out += f"[{describe(part, 40)}]"
    return out


def error_reason(err: ErrorDetails) -> str:
    """What is wrong, without the path: our validators' own words, else a short type message."""
    ctx = err.get("ctx") or {}
    if err["type"] == "value_error" and "error" in ctx:
        return str(ctx["error"])
    if err["type"] == "literal_error" and "expected" in ctx:
        return f"expected {ctx['expected']}, got {_brief(err['input'])}"
    if err["type"] in _REQUIRED:
        return "is required"
    expected = _EXPECTED.get(err["type"], err["msg"])
    return f"{expected}, got {_brief(err['input'])}"


def one_line(text: str) -> str:
    """Collapse whitespace and cut short: messages end up in admission warnings and conditions."""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def contract_error(e: ValidationError) -> ContractError:
    """The first error of `e` as a ContractError naming the field ("spec.storage.uri is
    required", "spec.interval: must be at least 1s, got '0s'"); pydantic's own multi-line text
    never reaches a user."""
    errors = e.errors()
    first = errors[0]
    field = error_path(first["loc"])
    path = field or "CheckpointPolicy"  # an empty location: the object itself
    reason = error_reason(first)
    message = f"{path} {reason}" if first["type"] in _REQUIRED else f"{path}: {reason}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return ContractError(one_line(message), field=field or None)
