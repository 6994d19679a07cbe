"""Properties over generated pods: the patch applies, reinvocation changes nothing, no user
value is lost. (The API server's acceptance of patched pods is in tests/integration/webhook.)"""

from __future__ import annotations

import copy
import datetime as dt

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.pki import make_ca
from tests.support.pod_strategies import policies, progress, training_pods
from webhook.mutation import mutate
from webhook.push_injection import PUSH_CA_ANNOTATION, PUSH_VOLUME

NS = {"metadata": {"name": "ns-x", "labels": {"kubeckpt.io/inject": "enabled"}}}
CA = make_ca(
    "kubeckpt-progress-ca",
    now=dt.datetime(2026, 11, 27, tzinfo=dt.UTC),
    validity=dt.timedelta(days=1),
    backdate=dt.timedelta(0),
).cert_pem.decode()


def _user_values(pod: dict) -> list[tuple]:
    """Everything the user set that the mutation must keep, as comparable tuples."""
    out: list[tuple] = []
    spec = pod["spec"]
    for v in spec.get("volumes", []):
        out.append(("volume", repr(v)))
    for c in spec["containers"]:
        for e in c.get("env", []):
            out.append(("env", c["name"], repr(e)))
        for m in c.get("volumeMounts", []):
            out.append(("mount", c["name"], repr(m)))
        for k, v in (c.get("lifecycle") or {}).items():
            out.append(("lifecycle", c["name"], k, repr(v)))
    for k, v in pod["metadata"].get("labels", {}).items():
        out.append(("label", k, v))
    for k, v in pod["metadata"].get("annotations", {}).items():
        out.append(("annotation", k, v))
    return out


def _find(pod: dict, item: tuple) -> bool:
    return item in _user_values(pod)


@settings(max_examples=300, deadline=None)
@given(pod=training_pods(), pol=policies(), tp=progress, push_ca=st.sampled_from([None, CA]))
def test_patch_applies_is_idempotent_and_keeps_user_values(
    pod: dict, pol: dict, tp: dict, push_ca: str | None
) -> None:
    before = copy.deepcopy(pod)
    r = mutate(pod, pol, NS, tp, push_ca=push_ca)
    assert pod == before
    assert jsonpatch.apply_patch(before, r.patch) == r.pod
    assert r.injected
    again = mutate(r.pod, pol, NS, tp, push_ca=push_ca)
    assert again.patch == [] and again.pod == r.pod
    # The push CA annotation is ours whenever our push volume reads it, whatever the pod had.
    ours = push_ca is not None and f"volume/{PUSH_VOLUME}" not in r.skipped
    ours = ours and (pol["spec"].get("progress") or {}).get("push") is True
    annotations = r.pod["metadata"].get("annotations", {})
    if ours:
        assert annotations[PUSH_CA_ANNOTATION] == push_ca
    else:
        assert annotations.get(PUSH_CA_ANNOTATION) == (
            before["metadata"].get("annotations") or {}
        ).get(PUSH_CA_ANNOTATION)
    for item in _user_values(before):
        if ours and item[:2] == ("annotation", PUSH_CA_ANNOTATION):
            continue
        assert _find(r.pod, item), f"user value lost: {item}"
    grace = before["spec"].get("terminationGracePeriodSeconds")
    if grace is not None:
        assert r.pod["spec"]["terminationGracePeriodSeconds"] >= grace
    names = [v["name"] for v in r.pod["spec"].get("volumes", [])]
    assert len(names) == len(set(names)), "volume names stay unique"
    for c in r.pod["spec"]["containers"]:
        envs = [e["name"] for e in c.get("env", [])]
        assert len(envs) == len(set(envs)), "env names stay unique"
        paths = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])]
        assert len(paths) == len(set(paths)), "mount paths stay unique"
        for m in c.get("volumeMounts", []):
            assert m["name"] in names, "every mount names a volume"
