"""The policy's `localTier.peerCopy` (issue 28): what the webhook injects, and how much memory the
ramdisk it sizes counts for the peer copy."""

from __future__ import annotations

import pytest

from kubeckpt_api.policy import policy_from_object
from kubeckpt_api.policy_model import CheckpointPolicySpec
from tests.unit.webhook.test_mutation import NS, env_of, pod, policy
from webhook.mutation import mutate


def _volume(r) -> dict:
    return {v["name"]: v for v in r.pod["spec"]["volumes"]}["kubeckpt-local"]["emptyDir"]


def test_peer_copy_injects_its_switch_and_the_pod_ip() -> None:
    r = mutate(pod(), policy(localTier={"enabled": True, "peerCopy": True}), NS)
    env = env_of(r.pod)
    assert env["CHECKPOINT_LOCAL_PEER"] == {"name": "CHECKPOINT_LOCAL_PEER", "value": "true"}
    assert env["KUBECKPT_POD_IP"]["valueFrom"] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}
    }
    assert env["CHECKPOINT_LOCAL_DIR"]["value"] == "/var/run/kubeckpt/local"


@pytest.mark.parametrize(
    "local",
    [
        {"enabled": True},  # peer copies off by default
        {"enabled": True, "peerCopy": False},
        {"enabled": False, "peerCopy": True},  # no local tier: nothing to copy
    ],
)
def test_no_peer_copy_injects_nothing_of_it(local: dict) -> None:
    env = env_of(mutate(pod(), policy(localTier=local), NS).pod)
    assert "CHECKPOINT_LOCAL_PEER" not in env and "KUBECKPT_POD_IP" not in env


def test_the_derived_ramdisk_size_counts_the_peer_copy() -> None:
    params = {"enabled": True, "modelParameters": 7_000_000_000}
    alone = mutate(pod(), policy(localTier=params), NS)
    peered = mutate(pod(), policy(localTier={**params, "peerCopy": True}), NS)
    # 2 x (7e9 x 12 B / 4 nodes) x 1.15 = 46062.5 MiB, rounded up; with a peer's copy kept the
    # same way (one complete, one arriving), 4 x: 92124.9 MiB.
    assert _volume(alone) == {"medium": "Memory", "sizeLimit": "46063Mi"}
    assert _volume(peered) == {"medium": "Memory", "sizeLimit": "92125Mi"}


def test_an_explicit_size_limit_stays_the_bound() -> None:
    local = {"enabled": True, "sizeLimit": "8Gi", "modelParameters": 10**9, "peerCopy": True}
    assert _volume(mutate(pod(), policy(localTier=local), NS))["sizeLimit"] == "8Gi"


def test_the_policy_field_parses_and_refuses_what_is_not_a_boolean() -> None:
    spec = CheckpointPolicySpec.model_validate(
        {"storage": {"uri": "pvc://c/r"}, "localTier": {"enabled": True, "peerCopy": True}}
    )
    assert spec.local_tier.peer_copy is True
    assert policy_from_object(policy(localTier={"enabled": True, "peerCopy": True})).local_peer_copy
    assert not policy_from_object(policy(localTier={"enabled": True})).local_peer_copy
    with pytest.raises(ValueError):
        CheckpointPolicySpec.model_validate(
            {"storage": {"uri": "pvc://c/r"}, "localTier": {"peerCopy": "sometimes"}}
        )
