"""Zero-code mode in the pod mutation (instrumentation.auto): the init container, the read-only
runtime volume and PYTHONPATH, the user's PYTHONPATH kept in every form, idempotency."""

from __future__ import annotations

import base64
import copy
import json

import jsonpatch
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.pod_strategies import policies, training_pods
from tests.unit.webhook.test_mutation import NS, PLAIN_NS, env_of, pod, policy
from webhook.main import parse_args
from webhook.mutation import (
    DEFAULT_RUNTIME_IMAGE,
    RUNTIME_DIR,
    RUNTIME_INIT_CONTAINER,
    RUNTIME_VOLUME,
    USER_PYTHONPATH,
    mutate,
)
from webhook.server import make_app
from webhook.view import StaticView

OURS = f"{RUNTIME_DIR}/kubeckpt-hook:{RUNTIME_DIR}"
AUTO = {"instrumentation": {"auto": True}}


def container(p: dict, name: str = "pytorch") -> dict:
    return next(c for c in p["spec"]["containers"] if c["name"] == name)


def inits(p: dict) -> list[dict]:
    return [c for c in p["spec"].get("initContainers", []) if c["name"] == RUNTIME_INIT_CONTAINER]


def with_env(*entries: dict, **over: object) -> dict:
    p = pod(**over)
    container(p)["env"] = [{"name": "PET_NNODES", "value": "4"}, *entries]
    return p


def test_not_added_unless_the_policy_asks() -> None:
    r = mutate(pod(), policy(), NS)
    assert r.injected
    assert "initContainers" not in r.pod["spec"]
    assert RUNTIME_VOLUME not in {v["name"] for v in r.pod["spec"]["volumes"]}
    assert "PYTHONPATH" not in env_of(r.pod)
    assert "instrumentation" not in json.loads(
        r.pod["metadata"]["annotations"]["kubeckpt.io/status"]
    )


def test_adds_init_container_volume_read_only_mount_and_pythonpath() -> None:
    original = pod()
    r = mutate(original, policy(**AUTO), NS)
    assert r.injected and jsonpatch.apply_patch(original, r.patch) == r.pod
    [init] = r.pod["spec"]["initContainers"]
    assert init["name"] == RUNTIME_INIT_CONTAINER and init["image"] == DEFAULT_RUNTIME_IMAGE
    assert init["command"] == ["python", "-m", "trainer_runtime.zerocode.install", RUNTIME_DIR]
    assert init["volumeMounts"] == [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_DIR}]
    sc = init["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert init["resources"]["limits"]["memory"] and init["resources"]["requests"]["cpu"]
    assert {"name": RUNTIME_VOLUME, "emptyDir": {}} in r.pod["spec"]["volumes"]
    mounts = container(r.pod)["volumeMounts"]
    assert {"name": RUNTIME_VOLUME, "mountPath": RUNTIME_DIR, "readOnly": True} in mounts
    assert env_of(r.pod)["PYTHONPATH"] == {"name": "PYTHONPATH", "value": OURS}
    # Only the container that gets our env: the sidecar is untouched.
    assert container(r.pod, "sidecar") == container(original, "sidecar")
    status = json.loads(r.pod["metadata"]["annotations"]["kubeckpt.io/status"])
    assert status["instrumentation"] == "auto"


def test_runtime_image_is_the_callers() -> None:
    r = mutate(pod(), policy(**AUTO), NS, runtime_image="registry.example/kubeckpt:9")
    assert inits(r.pod)[0]["image"] == "registry.example/kubeckpt:9"


def test_user_init_containers_are_kept_and_ours_runs_last() -> None:
    original = pod()
    original["spec"]["initContainers"] = [{"name": "fetch-data", "image": "busybox"}]
    r = mutate(original, policy(**AUTO), NS)
    assert [c["name"] for c in r.pod["spec"]["initContainers"]] == [
        "fetch-data",
        RUNTIME_INIT_CONTAINER,
    ]
    assert r.pod["spec"]["initContainers"][0] == {"name": "fetch-data", "image": "busybox"}


def test_annotation_overrides_the_policy_either_way() -> None:
    on = pod(
        metadata={**pod()["metadata"], "annotations": {"kubeckpt.io/instrumentation-auto": "true"}}
    )
    assert inits(mutate(on, policy(), NS).pod)
    off = pod(
        metadata={**pod()["metadata"], "annotations": {"kubeckpt.io/instrumentation-auto": "no"}}
    )
    assert not inits(mutate(off, policy(**AUTO), NS).pod)
    bad = pod(
        metadata={**pod()["metadata"], "annotations": {"kubeckpt.io/instrumentation-auto": "x"}}
    )
    r = mutate(bad, policy(**AUTO), NS)
    assert inits(r.pod) and any("instrumentation-auto" in w for w in r.warnings)


def test_plain_user_pythonpath_gets_ours_prepended() -> None:
    original = with_env({"name": "PYTHONPATH", "value": "/app/src:$(HOME)/lib"})
    r = mutate(original, policy(**AUTO), NS)
    env = container(r.pod)["env"]
    assert [e["name"] for e in env].count("PYTHONPATH") == 1
    assert env[1] == {"name": "PYTHONPATH", "value": f"{OURS}:/app/src:$(HOME)/lib"}
    assert "env/PYTHONPATH" not in r.skipped


def test_empty_user_pythonpath_becomes_ours() -> None:
    r = mutate(with_env({"name": "PYTHONPATH", "value": ""}), policy(**AUTO), NS)
    assert env_of(r.pod)["PYTHONPATH"]["value"] == OURS


def test_value_from_user_pythonpath_is_renamed_and_referenced() -> None:
    ref = {"configMapKeyRef": {"name": "paths", "key": "pythonpath"}}
    original = with_env(
        {"name": "PYTHONPATH", "valueFrom": ref},
        {"name": "EXTRA", "value": "$(PYTHONPATH):/x"},
    )
    r = mutate(original, policy(**AUTO), NS)
    env = container(r.pod)["env"]
    names = [e["name"] for e in env]
    # The user's value, under a new name, is defined before ours, and ours before what uses it.
    assert names[:4] == ["PET_NNODES", USER_PYTHONPATH, "PYTHONPATH", "EXTRA"]
    assert env[1] == {"name": USER_PYTHONPATH, "valueFrom": ref}
    assert env[2] == {"name": "PYTHONPATH", "value": f"{OURS}:$({USER_PYTHONPATH})"}
    assert env[3] == {"name": "EXTRA", "value": "$(PYTHONPATH):/x"}
    assert jsonpatch.apply_patch(original, r.patch) == r.pod


def test_env_from_pythonpath_is_referenced() -> None:
    original = pod()
    container(original)["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    r = mutate(original, policy(**AUTO), NS)
    assert env_of(r.pod)["PYTHONPATH"]["value"] == f"{OURS}:$(PYTHONPATH)"


def test_reinvocation_adds_nothing() -> None:
    first = mutate(with_env({"name": "PYTHONPATH", "value": "/app"}), policy(**AUTO), NS)
    again = mutate(first.pod, policy(**AUTO), NS)
    assert again.patch == [] and again.pod == first.pod


def test_a_pod_already_carrying_our_init_container_gets_no_second_one() -> None:
    """Even without our marker (stripped by a copy): names of ours that are taken skip it all."""
    first = mutate(pod(), policy(**AUTO), NS).pod
    stripped = copy.deepcopy(first)
    del stripped["metadata"]["labels"]["kubeckpt.io/injected"]
    del stripped["metadata"]["annotations"]["kubeckpt.io/status"]
    r = mutate(stripped, policy(**AUTO), NS)
    assert r.injected and len(inits(r.pod)) == 1
    assert "instrumentation/auto" in r.skipped
    assert any("zero-code instrumentation not added" in w for w in r.warnings)
    assert env_of(r.pod)["PYTHONPATH"]["value"] == OURS  # not prepended twice


def test_taken_volume_name_or_mount_path_skips_it_all() -> None:
    taken_volume = pod()
    taken_volume["spec"]["volumes"] = [{"name": RUNTIME_VOLUME, "emptyDir": {}}]
    taken_path = pod()
    container(taken_path)["volumeMounts"] = [{"name": "data", "mountPath": RUNTIME_DIR + "/"}]
    taken_path["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    for original in (taken_volume, taken_path):
        r = mutate(original, policy(**AUTO), NS)
        assert r.injected and not inits(r.pod) and "PYTHONPATH" not in env_of(r.pod)
        assert "instrumentation/auto" in r.skipped


def test_pods_not_injected_get_nothing() -> None:
    not_training = pod(metadata={"name": "web", "namespace": "team-a", "labels": {}})
    for original, ns in ((pod(), PLAIN_NS), (not_training, NS)):
        r = mutate(original, policy(**AUTO), ns)
        assert not r.injected and r.patch == [] and r.pod == original


pythonpaths = st.sampled_from(
    [
        None,
        {"name": "PYTHONPATH", "value": "/app"},
        {"name": "PYTHONPATH", "value": ""},
        {"name": "PYTHONPATH", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
)


@settings(max_examples=200, deadline=None)
@given(p=training_pods(), pol=policies(), user=pythonpaths, env_from=st.booleans())
def test_property_applies_once_and_keeps_the_users_pythonpath(
    p: dict, pol: dict, user: dict | None, env_from: bool
) -> None:
    pol["spec"]["instrumentation"] = {"auto": True}
    target = next(
        (c for c in p["spec"]["containers"] if c["name"] in ("pytorch", "node")),
        p["spec"]["containers"][0],
    )
    if user is not None:
        target.setdefault("env", []).insert(0, copy.deepcopy(user))
    if env_from:
        target["envFrom"] = [{"secretRef": {"name": "s"}}]
    before = copy.deepcopy(p)
    r = mutate(p, pol, NS)
    assert p == before and jsonpatch.apply_patch(before, r.patch) == r.pod
    again = mutate(r.pod, pol, NS)
    assert again.patch == [] and again.pod == r.pod
    taken = any(v["name"] == RUNTIME_VOLUME for v in before["spec"].get("volumes", []))
    assert len(inits(r.pod)) == (0 if taken else 1)
    out = next(c for c in r.pod["spec"]["containers"] if c["name"] == target["name"])
    env = {e["name"]: e for e in out.get("env", [])}
    names = [e["name"] for e in out.get("env", [])]
    assert len(names) == len(set(names))
    if taken:
        return
    value = env["PYTHONPATH"]["value"]
    assert value.startswith(OURS)
    if user is None:
        assert value == (f"{OURS}:$(PYTHONPATH)" if env_from else OURS)
    elif "valueFrom" in user:
        assert value == f"{OURS}:$({USER_PYTHONPATH})"
        assert env[USER_PYTHONPATH]["valueFrom"] == user["valueFrom"]
        assert names.index(USER_PYTHONPATH) < names.index("PYTHONPATH")
    else:
        assert value == (f"{OURS}:{user['value']}" if user["value"] else OURS)
    for c in r.pod["spec"]["containers"]:
        if c["name"] != target["name"]:
            assert "PYTHONPATH" not in {e["name"] for e in c.get("env", [])}
            assert RUNTIME_DIR not in {m["mountPath"] for m in c.get("volumeMounts", [])}


async def test_server_passes_the_runtime_image_through() -> None:
    app = make_app(
        StaticView(namespaces=[NS], policies=[policy(**AUTO)]), runtime_image="reg.example/k:1"
    )
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "team-a",
            "object": pod(),
        },
    }
    async with TestClient(TestServer(app)) as client:
        body = await (await client.post("/mutate", json=review)).json()
    patch = json.loads(base64.b64decode(body["response"]["patch"]))
    assert inits(jsonpatch.apply_patch(pod(), patch))[0]["image"] == "reg.example/k:1"


def test_runtime_image_option_env_and_default(monkeypatch) -> None:
    monkeypatch.delenv("KUBECKPT_RUNTIME_IMAGE", raising=False)
    assert parse_args([]).runtime_image == DEFAULT_RUNTIME_IMAGE
    monkeypatch.setenv("KUBECKPT_RUNTIME_IMAGE", "env.example/k:2")
    assert parse_args([]).runtime_image == "env.example/k:2"
    assert parse_args(["--runtime-image", "cli.example/k:3"]).runtime_image == "cli.example/k:3"
