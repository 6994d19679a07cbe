"""Hostile policies and annotations: whatever the shape, parsing ends in a Policy, a ContractError
with one short line naming a field, or admission warnings; never another exception (which would
fail the admission open with "internal error", or stop the policy status controller)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kubeckpt_api.policy import OVERRIDES, RESERVED, Policy, apply_overrides, policy_from_object
from trainer_runtime.contract import ContractError

FIELDS = [
    "spec", "metadata", "storage", "uri", "mountPath", "secretRef", "name", "namespace",
    "creationTimestamp", "uid", "resourceVersion", "interval", "strategy", "saveSteps",
    "maxCheckpoints", "resume", "jit", "enabled", "maxGracePeriodSeconds", "localTier",
    "sizeLimit", "modelParameters", "periodSteps", "progress", "updateEverySteps",
    "instrumentation", "auto", "selector", "matchLabels", "matchExpressions", "key", "operator",
    "values",
]  # fmt: skip

huge = st.builds(
    lambda unit, n: unit * n,
    st.sampled_from(["9", "1e9", "x", "\n", "\u0661", "5m", "{"]),
    st.integers(1_000, 200_000),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62),
    st.floats(),  # NaN and infinities too
    st.text(max_size=24),
    st.sampled_from(
        ["0", "-1", "5m", "0s", "NaN", "Infinity", "1e999999999", "8Gi", "steps", "In", "²"]
    ),
    huge,
)
junk = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=24,
)

VALID = {
    "apiVersion": "kubeckpt.io/v1alpha1",
    "kind": "CheckpointPolicy",
    "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {
        "selector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]},
        "storage": {"uri": "s3://bucket/p", "secretRef": {"name": "creds"}},
        "interval": "10m",
        "strategy": "steps",
        "saveSteps": 100,
        "jit": {"enabled": True, "maxGracePeriodSeconds": 600},
        "localTier": {"enabled": True, "sizeLimit": "8Gi", "periodSteps": 50},
        "progress": {"updateEverySteps": 5},
        "instrumentation": {"auto": False},
    },
}


def _paths(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    return out


PATHS = _paths(VALID)[1:]


@st.composite
def damaged_policies(draw: Any) -> dict[str, Any]:
    """VALID with one to three fields replaced by junk (or a junk key added beside them)."""
    o = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = o
        for k in path[:-1]:
            if not isinstance(parent, dict) or not isinstance(parent.get(k), dict):
                break
            parent = parent[k]
        else:
            key = draw(st.sampled_from([path[-1], *FIELDS]))
            parent[key] = draw(junk)
    return o


def _check_parse(o: Any) -> None:
    try:
        p = policy_from_object(o)
    except ContractError as e:
        message = str(e)
        assert message and "\n" not in message and len(message) <= 400, message
        assert message.startswith(e.field or "CheckpointPolicy:"), (e.field, message)
        assert "validation error" not in message and "pydantic" not in message, message
    else:
        assert isinstance(p, Policy)
        assert p.interval_seconds >= 1 and p.max_checkpoints >= 1
        assert 30 <= p.max_grace_seconds <= 86400
        assert p.strategy in ("time", "steps", "epoch")


@settings(max_examples=400, deadline=None)
@given(o=damaged_policies())
def test_damaged_policy_is_a_policy_or_one_clean_line(o: dict[str, Any]) -> None:
    _check_parse(o)


@settings(max_examples=200, deadline=None)
@given(o=junk)
def test_anything_at_all_is_a_policy_or_one_clean_line(o: Any) -> None:
    _check_parse(o)
    _check_parse({"spec": o})
    _check_parse({"metadata": o, "spec": {"storage": {"uri": "pvc://c"}}})


suffixes = st.sampled_from([*OVERRIDES, *RESERVED, "bogus", ""])
annotation_keys = st.one_of(
    suffixes.map(lambda s: "kubeckpt.io/" + s),
    st.text(max_size=30),
    st.integers(),  # only strings reach us from the API server; anything else is skipped
)
annotation_values = st.one_of(
    st.sampled_from(["true", "no", "0", "7", "10m", "0s", "8Gi", "1e999999999", "steps", "²"]),
    st.text(max_size=30),
    huge,
    junk,
)


@settings(max_examples=400, deadline=None)
@given(annotations=st.dictionaries(annotation_keys, annotation_values, max_size=8))
def test_any_annotations_give_a_policy_and_one_line_warnings(annotations: dict) -> None:
    base = Policy(name="p", namespace="n", storage_uri="file:///x", save_steps=10)
    got, warnings = apply_overrides(base, annotations)
    assert isinstance(got, Policy)
    assert got.interval_seconds >= 1 and got.strategy in ("time", "steps", "epoch")
    for w in warnings:
        assert isinstance(w, str) and w.startswith("kubeckpt: ") and "\n" not in w, w
        assert len(w) <= 400, w
    ours = {
        k
        for k in annotations
        if isinstance(k, str)
        and k.startswith("kubeckpt.io/")
        and k.removeprefix("kubeckpt.io/") not in RESERVED
    }
    # one warning per unusable annotation of ours (+1 for the steps fallback), none for others
    changed = {a for a in OVERRIDES.values() if getattr(got, a) != getattr(base, a)}
    assert len(warnings) <= len(ours) + 1
    assert len(changed) <= len(ours)
