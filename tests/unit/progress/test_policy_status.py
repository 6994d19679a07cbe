"""CheckpointPolicy status decisions: valid, invalid (what the webhook ignores), shadowed by an
older catch-all policy, the namespace opt-in hint, and stable transition times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubeckpt_api.optin import select_policy
from kubeckpt_api.status import condition
from progress_controller.policy_status import policy_status

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
OPTED_IN = {"metadata": {"name": "team", "labels": {"kubeckpt.io/inject": "enabled"}}}
PLAIN_NS = {"metadata": {"name": "team"}}


def pol(name: str, created: str = "2026-01-01T00:00:00Z", gen: int = 1, **spec: object) -> dict:
    return {
        "apiVersion": "kubeckpt.io/v1alpha1",
        "kind": "CheckpointPolicy",
        "metadata": {
            "name": name,
            "namespace": "team",
            "generation": gen,
            "creationTimestamp": created,
        },
        "spec": {"storage": {"uri": "pvc://ckpt/runs"}, **spec},
    }


def ready(status: dict) -> dict:
    c = condition(status["conditions"], "Ready")
    assert c is not None
    return c


def test_valid_policy_is_ready_with_its_generation() -> None:
    p = pol("a", gen=3)
    s = policy_status(p, [p], OPTED_IN, None, NOW)
    c = ready(s)
    assert (c["status"], c["reason"], c["observedGeneration"]) == ("True", "Valid", 3)
    assert s["observedGeneration"] == 3
    assert "every training pod" in c["message"] and "label" not in c["message"]


def test_namespace_not_opted_in_says_how_pods_are_covered() -> None:
    p = pol("a", selector={"matchLabels": {"team": "nlp"}})
    c = ready(policy_status(p, [p], PLAIN_NS, None, NOW))
    assert c["status"] == "True"
    assert "kubeckpt.io/inject=true" in c["message"]
    assert "kubeckpt.io/inject=enabled" in c["message"]
    assert "spec.selector" in c["message"]


def test_invalid_policy_says_why_and_that_pods_go_without() -> None:
    p = pol("bad")
    p["spec"]["storage"] = {}
    c = ready(policy_status(p, [p], OPTED_IN, None, NOW))
    assert (c["status"], c["reason"]) == ("False", "Invalid")
    assert "spec.storage.uri" in c["message"] and "without checkpoints" in c["message"]
    bad_interval = pol("bad2", interval="0s")
    c = ready(policy_status(bad_interval, [bad_interval], OPTED_IN, None, NOW))
    assert (c["status"], c["reason"]) == ("False", "Invalid"), c


def test_older_catch_all_policy_shadows_a_newer_one_as_select_policy_does() -> None:
    old = pol("old", created="2026-01-01T00:00:00Z")
    new = pol("new", created="2026-02-01T00:00:00Z", selector={"matchLabels": {"team": "nlp"}})
    both = [old, new]
    c = ready(policy_status(new, both, OPTED_IN, None, NOW))
    assert (c["status"], c["reason"]) == ("False", "Shadowed") and "old" in c["message"]
    assert ready(policy_status(old, both, OPTED_IN, None, NOW))["status"] == "True"
    # The admission side agrees: for the labels the newer one selects, the older one wins.
    chosen, _ = select_policy(both, {"team": "nlp"})
    assert chosen is old
    # An older policy with a selector does not shadow: pods it does not select reach the newer.
    narrow = pol("narrow", created="2025-01-01T00:00:00Z", selector={"matchLabels": {"x": "y"}})
    c = ready(policy_status(new, [narrow, new], OPTED_IN, None, NOW))
    assert c["status"] == "True"
    # A catch-all being deleted no longer counts.
    going = {**old, "metadata": {**old["metadata"], "deletionTimestamp": "2026-03-01T00:00:00Z"}}
    assert ready(policy_status(new, [going, new], OPTED_IN, None, NOW))["status"] == "True"


def test_transition_time_kept_while_the_outcome_holds() -> None:
    p = pol("a")
    first = policy_status(p, [p], OPTED_IN, None, NOW)
    again = policy_status(p, [p], OPTED_IN, first, NOW + timedelta(hours=1))
    assert again == first  # nothing to write
    p2 = pol("a", gen=2)
    p2["spec"]["storage"] = {}
    flipped = policy_status(p2, [p2], OPTED_IN, first, NOW + timedelta(hours=2))
    assert ready(flipped)["lastTransitionTime"] != ready(first)["lastTransitionTime"]
    assert flipped["observedGeneration"] == 2


def test_hostile_values_stay_bounded_and_printable() -> None:
    p = pol("a", interval="\x1b[2J" + "9" * 5000)
    c = ready(policy_status(p, [p], OPTED_IN, None, NOW))
    assert c["status"] == "False"
    assert len(c["message"]) <= 1024 and "\x1b" not in c["message"]
