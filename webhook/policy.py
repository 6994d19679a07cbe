"""CheckpointPolicy: the effective settings for one pod (policy + validated per-job overrides).

Pure functions over plain dicts (the objects as the API server returns them). The API server
already applied the CRD's defaults; we apply them again so a policy read from an older CRD version,
or built by hand in a test, behaves the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.utils import parse_quantity as k8s_parse_quantity

from trainer_runtime.contract import STRATEGIES, ContractError, parse_duration

ANNOTATION_PREFIX = "kubeckpt.io/"
DEFAULT_MOUNT_PATH = "/mnt/kubeckpt"
DEFAULT_LOCAL_SIZE = "8Gi"
MIN_GRACE_SECONDS = 30


@dataclass(frozen=True)
class Policy:
    """The settings the mutation needs, with DESIGN.md's defaults."""

    name: str
    namespace: str
    storage_uri: str
    mount_path: str = DEFAULT_MOUNT_PATH
    secret_name: str | None = None
    interval_seconds: int = 300
    strategy: str = "time"
    save_steps: int | None = None
    max_checkpoints: int = 3
    resume: bool = True
    jit: bool = True
    max_grace_seconds: int = 300
    local_enabled: bool = False
    local_size_limit: str | None = None
    local_model_parameters: int | None = None
    local_period_steps: int = 100
    progress_every_steps: int = 5
    auto_instrumentation: bool = False
    selector: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""


def policy_from_object(obj: Mapping[str, Any]) -> Policy:
    """Build a Policy from a CheckpointPolicy object. Raises ContractError on an unusable one."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    storage = spec.get("storage") or {}
    uri = storage.get("uri")
    if not isinstance(uri, str) or not uri:
        raise ContractError("spec.storage.uri is required", field="spec.storage.uri")
    jit = spec.get("jit") or {}
    local = spec.get("localTier") or {}
    progress = spec.get("progress") or {}
    instr = spec.get("instrumentation") or {}
    secret = storage.get("secretRef") or {}
    size = local.get("sizeLimit")
    return Policy(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        storage_uri=uri,
        mount_path=str(storage.get("mountPath") or DEFAULT_MOUNT_PATH).rstrip("/") or "/",
        secret_name=secret.get("name") or None,
        interval_seconds=_interval_seconds(str(spec.get("interval", "5m")), "spec.interval"),
        strategy=str(spec.get("strategy", "time")),
        save_steps=spec.get("saveSteps"),
        max_checkpoints=int(spec.get("maxCheckpoints", 3)),
        resume=bool(spec.get("resume", True)),
        jit=bool(jit.get("enabled", True)),
        max_grace_seconds=int(jit.get("maxGracePeriodSeconds", 300)),
        local_enabled=bool(local.get("enabled", False)),
        local_size_limit=None if size is None else str(size),
        local_model_parameters=local.get("modelParameters"),
        local_period_steps=int(local.get("periodSteps", 100)),
        progress_every_steps=int(progress.get("updateEverySteps", 5)),
        auto_instrumentation=bool(instr.get("auto", False)),
        selector=spec.get("selector") or {},
        created=str(meta.get("creationTimestamp", "")),
    )


def _interval_seconds(text: str, where: str) -> int:
    seconds = parse_duration(text) if not text.isdigit() else float(text)
    if seconds < 1:
        raise ContractError(f"must be at least 1s, got {text!r}", field=where)
    return math.ceil(seconds)


# --- per-job overrides ---


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in ("true", "yes", "1"):
        return True
    if low in ("false", "no", "0"):
        return False
    raise ValueError("expected true or false")


def _positive_int(v: str) -> int:
    if not v.strip().isdigit() or int(v) < 1:
        raise ValueError("expected a positive integer")
    return int(v)


def _strategy(v: str) -> str:
    if v not in STRATEGIES:
        raise ValueError(f"expected one of {', '.join(STRATEGIES)}")
    return v


def _interval(v: str) -> int:
    try:
        return _interval_seconds(v.strip(), "interval")
    except ContractError as e:
        raise ValueError(str(e)) from None


def _grace(v: str) -> int:
    n = _positive_int(v)
    if not MIN_GRACE_SECONDS <= n <= 86400:
        raise ValueError(f"expected {MIN_GRACE_SECONDS}..86400")
    return n


def _quantity(v: str) -> str:
    parse_quantity(v)
    return v.strip()


# annotation suffix -> (Policy field, parser)
OVERRIDES: dict[str, tuple[str, Any]] = {
    "interval": ("interval_seconds", _interval),
    "strategy": ("strategy", _strategy),
    "save-steps": ("save_steps", _positive_int),
    "max-checkpoints": ("max_checkpoints", _positive_int),
    "resume": ("resume", _bool),
    "jit": ("jit", _bool),
    "max-grace-period-seconds": ("max_grace_seconds", _grace),
    "local-tier": ("local_enabled", _bool),
    "local-size-limit": ("local_size_limit", _quantity),
    "local-period-steps": ("local_period_steps", _positive_int),
    "model-parameters": ("local_model_parameters", _positive_int),
    "progress-every-steps": ("progress_every_steps", _positive_int),
    "instrumentation-auto": ("auto_instrumentation", _bool),
}
# Annotations of ours that are not overrides (markers, status, opt-in).
RESERVED = {"status", "inject", "injected", "policy"}


def apply_overrides(policy: Policy, annotations: Mapping[str, str]) -> tuple[Policy, list[str]]:
    """Apply `kubeckpt.io/<field>` annotations; an invalid one is ignored with a warning."""
    changes: dict[str, Any] = {}
    warnings: list[str] = []
    for key, raw in sorted(annotations.items()):
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        suffix = key[len(ANNOTATION_PREFIX) :]
        if suffix in RESERVED:
            continue
        if suffix not in OVERRIDES:
            warnings.append(f"kubeckpt: unknown annotation {key} ignored")
            continue
        attr, parse = OVERRIDES[suffix]
        try:
            changes[attr] = parse(str(raw))
        except ValueError as e:
            warnings.append(f"kubeckpt: invalid {key}={str(raw)[:64]!r} ignored: {e}")
    result = replace(policy, **changes)
    if result.strategy == "steps" and not result.save_steps:
        warnings.append(
            "kubeckpt: strategy steps without save-steps; falling back to the time strategy"
        )
        result = replace(result, strategy="time")
    return result, warnings


# --- quantities ---


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity such as 64Gi, 500M, 1e9 or 1073741824 (the official
    client's parser: exact decimals, every suffix and exponent form the API server accepts)."""
    try:
        value = k8s_parse_quantity(text.strip())
    # ArithmeticError: decimal.InvalidOperation, for forms the parser does not expect
    except (ValueError, ArithmeticError, TypeError) as e:
        raise ValueError(f"not a quantity: {text!r}") from e
    if value <= 0:
        raise ValueError(f"must be positive: {text!r}")
    return math.ceil(value)


def local_size_limit(policy: Policy, nodes: int) -> str:
    """DESIGN.md: sizeLimit, else 2 x (params x 12 B / nodes) x 1.15, else the default."""
    if policy.local_size_limit:
        return policy.local_size_limit
    if policy.local_model_parameters:
        per_node = policy.local_model_parameters * 12 / max(nodes, 1)
        mib = math.ceil(2 * per_node * 1.15 / 2**20)
        return f"{max(mib, 1)}Mi"
    return DEFAULT_LOCAL_SIZE
