"""CheckpointPolicy: the effective settings for one pod (policy + validated per-job overrides).

Pure functions over plain dicts (the objects as the API server returns them). The webhook injects
what they return; the progress controller's policy status runs the same parser, so the status
cannot disagree with admission. The API server already applied the CRD's defaults; the schema
(kubeckpt_api.policy_model, pydantic) applies them again so a policy read from an older CRD
version, or built by hand in a test, behaves the same. `Policy`
stays a flat frozen dataclass: the mutation reads a dozen settings and tests build it by hand,
which the nested spec model would make verbose.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from trainer_runtime.contract import ContractError
from trainer_runtime.contract.errors import describe

from .optin import ANNOTATION_PREFIX
from .policy_model import (
    DEFAULT_MOUNT_PATH,
    MIN_GRACE_SECONDS,
    OVERRIDES,
    CheckpointPolicy,
    Overrides,
    contract_error,
    error_reason,
    one_line,
    parse_quantity,
)

__all__ = [
    "ANNOTATION_PREFIX",
    "DEFAULT_MOUNT_PATH",
    "MIN_GRACE_SECONDS",
    "OVERRIDES",
    "RESERVED",
    "Policy",
    "apply_overrides",
    "parse_quantity",
    "policy_from_object",
]


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
    on_unverifiable_checkpoints: str = "Fail"  # CHECKPOINT_ON_UNVERIFIABLE
    jit: bool = True
    max_grace_seconds: int = 300
    local_enabled: bool = False
    local_size_limit: str | None = None
    local_model_parameters: int | None = None
    local_period_steps: int = 100
    local_peer_copy: bool = False
    progress_every_steps: int = 5
    progress_push: bool = False
    auto_instrumentation: bool = False
    selector: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""


def policy_from_object(obj: Mapping[str, Any]) -> Policy:
    """Build a Policy from a CheckpointPolicy object.

    Raises ContractError (a ValueError: what mutation and the policy status controller catch)
    with one line naming the field, for anything unusable, whatever its shape.

    Results are cached by uid and resourceVersion: validating the model costs a few times what the
    hand-written parser did (see _parse), and every admission re-reads the same few policies from
    the informer. An object without both (built by hand) is parsed every time.
    """
    if not isinstance(obj, Mapping):
        raise ContractError("CheckpointPolicy: expected an object")
    meta = obj.get("metadata")
    key = None
    if isinstance(meta, Mapping):
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if isinstance(uid, str) and isinstance(version, str) and uid and version:
            key = (uid, version)
    if key is None:
        return _parse(obj)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is None:
        try:
            hit = _parse(obj)
        except ContractError as e:
            hit = (str(e), e.field)
        with _cache_lock:
            _cache[key] = hit
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(hit, Policy):
        return hit
    # a fresh exception each time: re-raising a cached one would grow its traceback
    raise ContractError(hit[0], field=hit[1])


# (uid, resourceVersion) -> Policy, or (message, field) of the ContractError. A new
# resourceVersion is a new key, so entries never go stale; old ones fall out in insertion order.
_CACHE_SIZE = 512
_cache: OrderedDict[tuple[str, str], Policy | tuple[str, str | None]] = OrderedDict()
_cache_lock = threading.Lock()  # both callers are asyncio today; cheap insurance for threads


def _parse(obj: Mapping[str, Any]) -> Policy:
    try:
        model = CheckpointPolicy.model_validate(obj)
    except ValidationError as e:
        raise contract_error(e) from None
    meta, spec = model.metadata, model.spec
    secret = spec.storage.secret_ref
    return Policy(
        name=meta.name,
        namespace=meta.namespace,
        storage_uri=spec.storage.uri,
        mount_path=spec.storage.mount_path,
        secret_name=(secret.name if secret else None) or None,
        interval_seconds=spec.interval_seconds,
        strategy=spec.strategy,
        save_steps=spec.save_steps,
        max_checkpoints=spec.max_checkpoints,
        resume=spec.resume,
        on_unverifiable_checkpoints=spec.on_unverifiable_checkpoints,
        jit=spec.jit.enabled,
        max_grace_seconds=spec.jit.max_grace_period_seconds,
        local_enabled=spec.local_tier.enabled,
        local_size_limit=spec.local_tier.size_limit,
        local_model_parameters=spec.local_tier.model_parameters,
        local_period_steps=spec.local_tier.period_steps,
        local_peer_copy=spec.local_tier.peer_copy,
        progress_every_steps=spec.progress.update_every_steps,
        progress_push=spec.progress.push,
        auto_instrumentation=spec.instrumentation.auto,
        # the selector as written (validated, unknown fields dropped); select_policy matches it
        selector=(
            spec.selector.model_dump(by_alias=True, exclude_unset=True) if spec.selector else {}
        ),
        created=meta.creation_timestamp,
    )


# --- per-job overrides ---

# Annotations of ours that are not overrides (markers, status, opt-in).
RESERVED = {"status", "inject", "injected", "policy", "progress-push-ca"}


def _shown_key(key: str) -> str:
    # API-server keys are short and printable; anything else is quoted so a warning stays a line
    return key if key.isprintable() and len(key) <= 320 else describe(key)


def apply_overrides(policy: Policy, annotations: Mapping[str, str]) -> tuple[Policy, list[str]]:
    """Apply `kubeckpt.io/<field>` annotations; an invalid one is ignored with a warning."""
    if not isinstance(annotations, Mapping):
        return policy, ["kubeckpt: annotations ignored: expected a map"]
    raw: dict[str, str] = {}  # suffix -> value, for the known override annotations
    notes: dict[str, str] = {}  # annotation key -> warning
    for key, value in annotations.items():
        if not isinstance(key, str) or not key.startswith(ANNOTATION_PREFIX):
            continue
        suffix = key[len(ANNOTATION_PREFIX) :]
        if suffix in RESERVED:
            continue
        if suffix not in OVERRIDES:
            notes[key] = f"kubeckpt: unknown annotation {_shown_key(key)} ignored"
        elif isinstance(value, str | int | float):  # the API server only has strings
            raw[suffix] = str(value)
        else:
            notes[key] = f"kubeckpt: invalid {_shown_key(key)} ignored: expected a string"
    try:
        overrides = Overrides.model_validate(raw)
    except ValidationError as e:
        # Each field validates on its own: drop the bad ones and take the rest.
        bad = {str(err["loc"][0]): err for err in e.errors()}
        for suffix, err in bad.items():
            key = ANNOTATION_PREFIX + suffix
            notes[key] = one_line(
                f"kubeckpt: invalid {_shown_key(key)}={raw.pop(suffix)[:64]!r} ignored: "
                f"{error_reason(err)}"
            )
        overrides = Overrides.model_validate(raw)
    changes = {name: getattr(overrides, name) for name in overrides.model_fields_set}
    warnings = [notes[k] for k in sorted(notes)]
    result = replace(policy, **changes)
    if result.strategy == "steps" and not result.save_steps:
        warnings.append(
            "kubeckpt: strategy steps without save-steps; falling back to the time strategy"
        )
        result = replace(result, strategy="time")
    return result, warnings
