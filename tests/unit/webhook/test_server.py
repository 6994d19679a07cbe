"""The HTTP layer: AdmissionReview handling, bad input, readiness and metrics (no TLS here; TLS
and the real API server are in tests/integration/webhook)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import AsyncIterator
from pathlib import Path

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.pki import make_ca
from tests.unit.webhook.test_mutation import NS, pod, policy
from webhook.push_ca import PushCAFile
from webhook.push_injection import PUSH_CA_ANNOTATION
from webhook.server import Metrics, make_app
from webhook.view import StaticView


class BrokenView(StaticView):
    def policies(self, namespace: str) -> list:
        raise RuntimeError("cache exploded")


class UnsyncedView(StaticView):
    def synced(self) -> bool:
        return False


def review(obj: object, **request: object) -> dict:
    req = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "team-a",
        "object": obj,
    }
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def view() -> StaticView:
    return StaticView(namespaces=[NS], policies=[policy()])


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    metrics = Metrics()
    app = make_app(view(), metrics=metrics)
    async with TestClient(TestServer(app)) as c:
        c.metrics = metrics  # type: ignore[attr-defined]
        yield c


async def test_pod_create_gets_a_patch_that_applies(client: TestClient) -> None:
    original = pod()
    resp = await client.post("/mutate", json=review(original))
    assert resp.status == 200
    body = await resp.json()
    r = body["response"]
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert r["uid"] == "u-1" and r["allowed"] is True and r["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(r["patch"]))
    patched = jsonpatch.apply_patch(original, patch)
    assert patched["metadata"]["labels"]["kubeckpt.io/injected"] == "true"


async def test_reinvocation_returns_no_patch(client: TestClient) -> None:
    first = await (await client.post("/mutate", json=review(pod()))).json()
    patched = jsonpatch.apply_patch(pod(), json.loads(base64.b64decode(first["response"]["patch"])))
    again = await (await client.post("/mutate", json=review(patched))).json()
    assert "patch" not in again["response"] and again["response"]["allowed"] is True


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"kind": "Pod", "apiVersion": "v1"}', "kind must be AdmissionReview"),
        (
            json.dumps(
                {
                    "kind": "AdmissionReview",
                    "apiVersion": "admission.k8s.io/v1beta1",
                    "request": {"uid": "x"},
                }
            ).encode(),
            "unsupported apiVersion",
        ),
        (
            json.dumps(
                {
                    "kind": "AdmissionReview",
                    "apiVersion": "admission.k8s.io/v1",
                    "request": {"object": {}},
                }
            ).encode(),
            "request.uid",
        ),
        (
            json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(),
            "request is missing",
        ),
        (b"\xff\xfe\x00garbage", "malformed JSON"),
    ],
)
async def test_bad_reviews_get_400_naming_the_problem(
    client: TestClient, body: bytes, needle: str
) -> None:
    resp = await client.post("/mutate", data=body, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert needle in (await resp.json())["error"]


async def test_oversized_body_gets_413(client: TestClient) -> None:
    big = b'{"x": "' + b"a" * (4 * 1024 * 1024 + 10) + b'"}'
    resp = await client.post("/mutate", data=big)
    assert resp.status == 413


async def test_non_pod_objects_are_allowed_unchanged(client: TestClient) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    resp = await client.post(
        "/mutate", json=review(cm, kind={"group": "", "version": "v1", "kind": "ConfigMap"})
    )
    r = (await resp.json())["response"]
    assert resp.status == 200 and r == {"uid": "u-1", "allowed": True}
    resp = await client.post("/mutate", json=review(pod(), operation="UPDATE"))
    assert (await resp.json())["response"] == {"uid": "u-1", "allowed": True}


async def test_internal_error_fails_open_with_a_warning() -> None:
    metrics = Metrics()
    app = make_app(BrokenView(namespaces=[NS]), metrics=metrics)
    async with TestClient(TestServer(app)) as c:
        resp = await c.post("/mutate", json=review(pod()))
        assert resp.status == 200
        r = (await resp.json())["response"]
        assert r["allowed"] is True and "patch" not in r
        assert "internal error" in r["warnings"][0]
    assert metrics.errors._value.get() == 1


async def test_invalid_override_is_a_warning_not_a_rejection(client: TestClient) -> None:
    p = pod()
    p["metadata"]["annotations"] = {"kubeckpt.io/max-checkpoints": "-2"}
    r = (await (await client.post("/mutate", json=review(p))).json())["response"]
    assert r["allowed"] is True and "patch" in r
    assert any("kubeckpt.io/max-checkpoints" in w for w in r["warnings"])


async def test_readiness_follows_cache_sync_and_certificate() -> None:
    async with TestClient(TestServer(make_app(UnsyncedView()))) as c:
        assert (await c.get("/readyz")).status == 503
        assert (await c.get("/healthz")).status == 200
    async with TestClient(TestServer(make_app(view(), has_certificate=lambda: False))) as c:
        assert (await c.get("/readyz")).status == 503
    async with TestClient(TestServer(make_app(view()))) as c:
        assert (await c.get("/readyz")).status == 200


async def test_metrics_count_results_and_skipped_fields(client: TestClient) -> None:
    p = pod()
    p["spec"]["containers"][1]["env"].append({"name": "CHECKPOINT_URI", "value": "x"})
    await client.post("/mutate", json=review(p))
    await client.post("/mutate", data=b"nope")
    text = await (await client.get("/metrics")).text()
    assert 'kubeckpt_webhook_requests_total{result="injected"} 1.0' in text
    assert 'kubeckpt_webhook_requests_total{result="bad_request"} 1.0' in text
    assert 'kubeckpt_webhook_skipped_fields_total{field="env"} 1.0' in text
    assert "kubeckpt_webhook_patches_applied_total 1.0" in text
    assert "kubeckpt_webhook_request_duration_seconds_bucket" in text


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    obj=json_values,
    uid=st.one_of(st.none(), st.text(max_size=5), st.integers()),
    kind=st.one_of(st.none(), json_values, st.just({"group": "", "kind": "Pod"})),
)
async def test_no_input_produces_a_500(obj: object, uid: object, kind: object) -> None:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": kind, "operation": "CREATE", "object": obj},
    }
    async with TestClient(TestServer(make_app(view()))) as c:
        resp = await c.post("/mutate", json=body)
        assert resp.status in (200, 400)


def _nested(depth: int, open_: str, close: str) -> bytes:
    return (open_ * depth + close * depth).encode()


hostile_bodies = st.one_of(
    st.binary(max_size=64),  # anything, invalid UTF-8 included
    st.integers(1, 200_000).map(lambda d: _nested(d, "[", "]")),  # past the parser's recursion
    st.integers(1, 50_000).map(lambda d: _nested(d, '{"a":', "}")[:-1] + b"1" + b"}" * d),
    st.integers(4_000, 60_000).map(lambda n: b'{"kind": ' + b"9" * n + b"}"),  # over int limit
    st.sampled_from([b"NaN", b"-Infinity", b"1e999999", b'{"kind": 1e999}', b"\xef\xbb\xbf{}"]),
    st.text(max_size=40).map(  # duplicate keys: the last one wins, as in Go
        lambda t: (
            '{"kind":"AdmissionReview","kind":' + json.dumps(t) + ',"apiVersion":'
            '"admission.k8s.io/v1","request":{"uid":"u","uid":' + json.dumps(t) + "}}"
        ).encode()
    ),
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=hostile_bodies)
async def test_no_body_produces_a_5xx_or_stops_the_server(body: bytes) -> None:
    async with TestClient(TestServer(make_app(view()))) as c:
        resp = await c.post("/mutate", data=body, headers={"Content-Type": "application/json"})
        assert resp.status in (200, 400, 413), (resp.status, body[:80])
        if resp.status == 400:
            assert "error" in await resp.json()
        assert (await c.get("/healthz")).status == 200  # still serving


async def test_the_push_ca_in_force_at_each_request_is_stamped(tmp_path: Path) -> None:
    """The CA file's current contents (PushCAFile, as main wires it) reach each push pod; while the
    file is unusable the pod gets the ConfigMap, and the request still succeeds."""
    now = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
    ca = make_ca("push", now=now, validity=dt.timedelta(days=1), backdate=dt.timedelta(0))
    path = tmp_path / "ca.crt"
    path.write_bytes(ca.cert_pem)
    ca_file = PushCAFile(path)
    ca_file.load_once()
    push_view = StaticView(namespaces=[NS], policies=[policy(progress={"push": True})])
    app = make_app(push_view, push_ca=ca_file.current)

    async def admitted() -> dict:
        body = await (await c.post("/mutate", json=review(pod()))).json()
        assert body["response"]["allowed"] is True
        return jsonpatch.apply_patch(pod(), json.loads(base64.b64decode(body["response"]["patch"])))

    async with TestClient(TestServer(app)) as c:
        stamped = await admitted()
        assert stamped["metadata"]["annotations"][PUSH_CA_ANNOTATION] == ca.cert_pem.decode()
        path.write_bytes(b"garbage")
        ca_file.load_once()
        fallback = await admitted()
        assert PUSH_CA_ANNOTATION not in fallback["metadata"]["annotations"]
        vol = next(v for v in fallback["spec"]["volumes"] if v["name"] == "kubeckpt-progress-push")
        assert vol["projected"]["sources"][1]["configMap"]["name"] == "kubeckpt-progress-ca"
