"""The grace period is sized from what a training pod reported (its TrainingProgress): no content
of that record raises, values out of kubeckpt_api.status_bounds are ignored (the policy's bound
applies), and the job's next pod is still injected."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeckpt_api.policy import MIN_GRACE_SECONDS, Policy
from kubeckpt_api.status_bounds import MAX_SAVE_SECONDS, MAX_STEP_SECONDS
from tests.support.operator_pods import operator_pod, training_progress
from webhook.mutation import grace_seconds
from webhook.server import decide
from webhook.view import StaticView

POL = Policy(name="p", namespace="n", storage_uri="file:///x", max_grace_seconds=120)
NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}
POLICY = {
    "metadata": {"name": "p", "namespace": "team-a"},
    "spec": {"storage": {"uri": "pvc://ckpt/runs"}, "jit": {"maxGracePeriodSeconds": 120}},
}


def record(step: object, save: object) -> dict:
    return {"status": {"stepSeconds": step, "checkpointing": {"lastSaveSeconds": save}}}


HOSTILE = [
    "1e308",  # finite, yet (save + step) * 1.5 overflowed to inf and ceil() raised
    "1" + "0" * 400,
    "1e999",
    "-5",
    "-0.5",
    "nan",
    "NaN",
    "inf",
    "-Infinity",
    "0x10",
    " 20",
    "20s",
    "",
    str(MAX_SAVE_SECONDS + 1),
    10**400,  # not a string: the CRD stores these as decimal strings
    1e308,
    float("nan"),
    True,
    None,
    ["20"],
    {"value": "20"},
]


@pytest.mark.parametrize("save", HOSTILE)
def test_a_save_time_out_of_bounds_is_ignored(save: object) -> None:
    assert grace_seconds(POL, record("2", save)) == 120


@pytest.mark.parametrize("step", HOSTILE)
def test_a_step_time_out_of_bounds_is_ignored(step: object) -> None:
    # the save alone sizes it: (20 + 0) x 1.5 + 10
    assert grace_seconds(POL, record(step, "20")) == 40


def test_in_bounds_values_still_size_the_grace() -> None:
    assert grace_seconds(POL, record("2", "20")) == 43  # (2 + 20) x 1.5 + 10
    assert grace_seconds(POL, record(str(MAX_STEP_SECONDS), "1")) == 120  # the policy caps it
    assert grace_seconds(POL, record(str(MAX_STEP_SECONDS + 1), "20")) == 40  # step ignored
    assert grace_seconds(POL, record("0.1", "1")) == MIN_GRACE_SECONDS


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from([h for h in HOSTILE if isinstance(h, str)]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=16), inner),
    max_leaves=12,
)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**500), max_value=10**500).map(str),
    st.from_regex(r"-?[0-9]{0,400}(\.[0-9]{0,20})?([eE][+-]?[0-9]{1,5})?", fullmatch=True),
    json_like,
)
statuses = st.one_of(
    json_like,
    st.builds(record, numbers, numbers),
    st.builds(lambda s: {"status": s}, json_like),
    st.builds(lambda c: {"status": {"checkpointing": c}}, json_like),
)


@settings(max_examples=500, deadline=None)
@given(progress=statuses, cap=st.integers(MIN_GRACE_SECONDS, 86400))
def test_no_record_raises_and_the_grace_stays_within_the_policy(progress: Any, cap: int) -> None:
    pol = Policy(name="p", namespace="n", storage_uri="file:///x", max_grace_seconds=cap)
    got = grace_seconds(pol, progress)
    assert isinstance(got, int) and MIN_GRACE_SECONDS <= got <= cap


@pytest.mark.parametrize(("step", "save"), [("1e308", "1e308"), ("2", "1e308"), ("1e308", "2")])
def test_the_next_pod_of_a_job_with_a_hostile_record_is_still_injected(
    step: str, save: str
) -> None:
    pod = operator_pod("PyTorchJob", "llama", "team-a")
    uid = pod["metadata"]["ownerReferences"][0]["uid"]
    tp = training_progress(
        "llama", "team-a", "PyTorchJob", "llama", uid, record(step, save)["status"]
    )
    view = StaticView(namespaces=[NS], policies=[POLICY], progress=[tp])
    request = {"uid": "u", "namespace": "team-a", "object": pod}
    result = decide(view, request)
    assert result.injected, result.reason
    # an ignored save: the policy's bound; a save of 2 s alone: (2 + 0) x 1.5 + 10, so the floor
    expected = 120 if save == "1e308" else MIN_GRACE_SECONDS
    assert result.pod["spec"]["terminationGracePeriodSeconds"] == expected
