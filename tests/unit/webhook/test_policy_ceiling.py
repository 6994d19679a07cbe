"""The policy is the ceiling, as the pod gets it: an annotation above a limit is clamped to the
policy's value, with an admission warning and a `skipped` entry in kubeckpt.io/status; a lower
one is honoured."""

from __future__ import annotations

import json

from aiohttp.test_utils import TestClient, TestServer

from kubeckpt_api.optin import STATUS_ANNOTATION
from tests.support.operator_pods import operator_pod, training_progress
from tests.unit.webhook.test_server import review
from webhook.mutation import mutate
from webhook.server import make_app
from webhook.view import StaticView

NS = {"metadata": {"name": "team-a", "labels": {"kubeckpt.io/inject": "enabled"}}}


def policy(**spec: object) -> dict:
    return {
        "metadata": {"name": "capped", "namespace": "team-a"},
        "spec": {"storage": {"uri": "pvc://ckpt/runs"}, **spec},
    }


CAP_120 = policy(jit={"maxGracePeriodSeconds": 120})


def pod(**annotations: str) -> dict:
    p = operator_pod("PyTorchJob", "llama", "team-a")
    p["metadata"]["annotations"] = {f"kubeckpt.io/{k}": v for k, v in annotations.items()}
    return p


def status(p: dict) -> dict:
    return json.loads(p["metadata"]["annotations"][STATUS_ANNOTATION])


def env(p: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in p["spec"]["containers"][0]["env"]}


def test_a_grace_annotation_of_a_day_under_a_cap_of_120_gives_120() -> None:
    r = mutate(pod(**{"max-grace-period-seconds": "86400"}), CAP_120, NS)
    assert r.injected
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert status(r.pod)["skipped"] == ["override/max-grace-period-seconds"]
    assert status(r.pod)["gracePeriodSeconds"] == 120
    assert r.warnings == [
        "kubeckpt: kubeckpt.io/max-grace-period-seconds=86400 is above CheckpointPolicy "
        "capped's limit; 120 applies"
    ]
    # the preStop waits within the policy's bound too
    command = r.pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2]
    assert "--timeout 110" in command


def test_a_measured_need_above_the_cap_is_still_capped() -> None:
    uid = pod()["metadata"]["ownerReferences"][0]["uid"]
    slow = {"stepSeconds": "10", "checkpointing": {"lastSaveSeconds": "600"}}
    tp = training_progress("llama", "team-a", "PyTorchJob", "llama", uid, slow)
    r = mutate(pod(**{"max-grace-period-seconds": "86400"}), CAP_120, NS, tp)
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 120


def test_a_lower_grace_annotation_is_honoured_without_a_warning() -> None:
    r = mutate(pod(**{"max-grace-period-seconds": "60"}), CAP_120, NS)
    assert r.pod["spec"]["terminationGracePeriodSeconds"] == 60
    assert r.warnings == [] and "skipped" not in status(r.pod)


def test_max_checkpoints_and_the_local_tier_are_held_to_the_policy() -> None:
    pol = policy(maxCheckpoints=3, localTier={"enabled": True, "modelParameters": 1_000_000_000})
    r = mutate(
        pod(**{"max-checkpoints": "1000", "model-parameters": "70000000000"}),
        pol,
        NS,
    )
    assert env(r.pod)["CHECKPOINT_MAX_CHECKPOINTS"] == "3"
    local = next(v for v in r.pod["spec"]["volumes"] if v["name"] == "kubeckpt-local")
    assert local["emptyDir"]["sizeLimit"] == "26322Mi"  # 2 x (1e9 x 12 B / 1 node) x 1.15 in MiB
    assert status(r.pod)["skipped"] == ["override/max-checkpoints", "override/model-parameters"]
    assert len(r.warnings) == 2


def test_jit_stays_off_where_the_policy_turns_it_off() -> None:
    r = mutate(pod(jit="true"), policy(jit={"enabled": False}), NS)
    assert env(r.pod)["CHECKPOINT_JIT"] == "false"
    assert "lifecycle" not in r.pod["spec"]["containers"][0]
    assert "terminationGracePeriodSeconds" not in r.pod["spec"]
    assert status(r.pod)["skipped"] == ["override/jit"]


async def test_the_warning_reaches_the_api_server_and_the_clamp_is_counted() -> None:
    app = make_app(StaticView(namespaces=[NS], policies=[CAP_120]))
    async with TestClient(TestServer(app)) as client:
        body = await (
            await client.post("/mutate", json=review(pod(**{"max-grace-period-seconds": "86400"})))
        ).json()
        metrics = await (await client.get("/metrics")).text()
    assert body["response"]["warnings"][0].startswith(
        "kubeckpt: kubeckpt.io/max-grace-period-seconds=86400 is above"
    )
    assert 'kubeckpt_webhook_skipped_fields_total{field="override"} 1.0' in metrics
