"""The policy is the ceiling (kubeckpt_api.policy_limits): an override may lower a limit, never
raise it; every other override applies as given."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeckpt_api.policy import OVERRIDES, Policy, apply_overrides
from kubeckpt_api.policy_limits import LIMITS, cap_overrides, local_size_limit
from kubeckpt_api.policy_model import parse_quantity

POL = Policy(
    name="team",
    namespace="n",
    storage_uri="file:///x",
    max_grace_seconds=120,
    max_checkpoints=3,
    jit=True,
    local_enabled=True,
    local_size_limit="16Gi",
)


def capped(policy: Policy, annotations: dict[str, str], nodes: int = 1) -> tuple[Policy, list]:
    asked, warnings = apply_overrides(policy, annotations)
    assert warnings == []
    return cap_overrides(policy, asked, nodes=nodes)


def test_the_limits_are_overrides() -> None:
    assert {OVERRIDES[a] for a in LIMITS} == set(LIMITS.values())


def test_a_grace_period_above_the_cap_is_clamped_a_lower_one_honoured() -> None:
    """The issue's hostile case: 86400 under a policy cap of 120."""
    got, clamps = capped(POL, {"kubeckpt.io/max-grace-period-seconds": "86400"})
    assert got.max_grace_seconds == 120
    assert [c.skipped for c in clamps] == ["override/max-grace-period-seconds"]
    assert clamps[0].warning == (
        "kubeckpt: kubeckpt.io/max-grace-period-seconds=86400 is above CheckpointPolicy "
        "team's limit; 120 applies"
    )
    got, clamps = capped(POL, {"kubeckpt.io/max-grace-period-seconds": "60"})
    assert (got.max_grace_seconds, clamps) == (60, [])
    got, clamps = capped(POL, {"kubeckpt.io/max-grace-period-seconds": "120"})
    assert (got.max_grace_seconds, clamps) == (120, [])


@pytest.mark.parametrize(
    ("annotation", "above", "below", "attr", "limit"),
    [
        ("max-checkpoints", "50", "2", "max_checkpoints", 3),
        ("local-size-limit", "64Gi", "1Gi", "local_size_limit", "16Gi"),
    ],
)
def test_each_numeric_limit(annotation: str, above: str, below: str, attr: str, limit) -> None:
    got, clamps = capped(POL, {f"kubeckpt.io/{annotation}": above})
    assert getattr(got, attr) == limit and [c.annotation for c in clamps] == [annotation]
    got, clamps = capped(POL, {f"kubeckpt.io/{annotation}": below})
    assert str(getattr(got, attr)) == below and clamps == []


def test_features_the_policy_turns_off_stay_off_and_may_be_turned_off() -> None:
    off = replace(POL, jit=False, local_enabled=False)
    got, clamps = capped(off, {"kubeckpt.io/jit": "true", "kubeckpt.io/local-tier": "true"})
    assert (got.jit, got.local_enabled) == (False, False)
    assert [c.skipped for c in clamps] == ["override/jit", "override/local-tier"]
    got, clamps = capped(POL, {"kubeckpt.io/jit": "false", "kubeckpt.io/local-tier": "no"})
    assert (got.jit, got.local_enabled, clamps) == (False, False, [])


def test_model_parameters_that_would_size_the_tier_above_the_policy() -> None:
    derived = replace(POL, local_size_limit=None, local_model_parameters=1_000_000_000)
    ceiling = local_size_limit(derived, 4)  # 2 x (1e9 x 12 B / 4) x 1.15
    assert ceiling == "6581Mi"
    got, clamps = capped(derived, {"kubeckpt.io/model-parameters": "70000000000"}, nodes=4)
    assert local_size_limit(got, 4) == ceiling and got.local_model_parameters == 1_000_000_000
    assert [c.annotation for c in clamps] == ["model-parameters"]
    assert clamps[0].asked == "70000000000" and clamps[0].applied == ceiling
    got, clamps = capped(derived, {"kubeckpt.io/model-parameters": "1000"}, nodes=4)
    assert got.local_model_parameters == 1000 and clamps == []
    # Without a size in the policy, its size is the default: 8Gi is the ceiling.
    bare = replace(POL, local_size_limit=None)
    got, clamps = capped(bare, {"kubeckpt.io/local-size-limit": "9Gi"})
    assert (got.local_size_limit, [c.annotation for c in clamps]) == ("8Gi", ["local-size-limit"])
    got, clamps = capped(bare, {"kubeckpt.io/model-parameters": "10000000000"})
    assert (local_size_limit(got, 1), [c.annotation for c in clamps]) == (
        "8Gi",
        ["model-parameters"],
    )


def test_preferences_apply_as_given() -> None:
    got, clamps = capped(
        POL,
        {
            "kubeckpt.io/interval": "1s",
            "kubeckpt.io/strategy": "epoch",
            "kubeckpt.io/resume": "false",
            "kubeckpt.io/local-period-steps": "1",
            "kubeckpt.io/progress-every-steps": "1",
            "kubeckpt.io/instrumentation-auto": "true",
        },
    )
    assert clamps == []
    assert (got.interval_seconds, got.strategy, got.resume, got.auto_instrumentation) == (
        1,
        "epoch",
        False,
        True,
    )


COUNTS = ["1", "2", "3", "30", "119", "120", "121", "86400", "true", "false", "0", "1e3", "1000"]
SIZES = ["1Gi", "16Gi", "17Gi", "20Gi", "70000000000"]
limit_values = st.sampled_from([*COUNTS, *SIZES])


@settings(max_examples=300, deadline=None)
@given(
    annotations=st.dictionaries(st.sampled_from(sorted(LIMITS)), limit_values, max_size=6),
    jit=st.booleans(),
    local=st.booleans(),
    size=st.sampled_from([None, "1Gi", "16Gi"]),
    params=st.sampled_from([None, 1000, 10**10]),
    nodes=st.integers(1, 64),
)
def test_no_override_raises_a_limit(
    annotations: dict, jit: bool, local: bool, size: str | None, params: int | None, nodes: int
) -> None:
    policy = replace(
        POL, jit=jit, local_enabled=local, local_size_limit=size, local_model_parameters=params
    )
    asked, _ = apply_overrides(policy, {f"kubeckpt.io/{k}": v for k, v in annotations.items()})
    got, clamps = cap_overrides(policy, asked, nodes=nodes)
    assert got.max_grace_seconds <= policy.max_grace_seconds
    assert got.max_checkpoints <= policy.max_checkpoints
    assert got.jit <= policy.jit and got.local_enabled <= policy.local_enabled
    if got.local_enabled:
        mine, theirs = local_size_limit(got, nodes), local_size_limit(policy, nodes)
        assert parse_quantity(mine) <= parse_quantity(theirs)
    # a clamp for each override that asked for more, none for the rest
    assert len({c.annotation for c in clamps}) == len(clamps) <= len(annotations)
    assert all(c.annotation in annotations for c in clamps)
    if not clamps:
        assert got == asked
