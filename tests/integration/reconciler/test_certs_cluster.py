"""Self-managed webhook certificates against the real local control plane.

Every MutatingWebhookConfiguration made here matches only ConfigMaps carrying a label unique to the
test, so it never intercepts anything else, and is deleted at the end (it is cluster-scoped).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web

from localcluster import LocalCluster
from localcluster.cluster import free_port
from reconciler import pki
from reconciler.admission import CA_BUNDLE, CertConfig, CertManager, Conflict, decode_secret_data
from reconciler.admission.api_store import ClientSecretStore
from reconciler.client import Client
from reconciler.errors import ApiError

SECRET = "kubeckpt-webhook-certs"
LABEL = "kubeckpt.io/certs-test"


def mwc_manifest(name: str, ports: tuple[int, int], *, failure_policy: str = "Ignore") -> dict:
    webhooks = []
    for i, port in enumerate(ports):
        webhooks.append(
            {
                "name": f"w{i}.{name}.kubeckpt.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate/{i}"},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                    }
                ],
                "objectSelector": {"matchLabels": {LABEL: name}},
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "timeoutSeconds": 5,
            }
        )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": webhooks,
    }


@contextlib.contextmanager
def webhook_configuration(
    cluster: LocalCluster, ports: tuple[int, int], **kw: str
) -> Iterator[str]:
    name = f"certs-test-{uuid.uuid4().hex[:8]}"
    cluster.apply(mwc_manifest(name, ports, **kw))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, "--wait=false", check=False)


def get_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def ca_bundles(cluster: LocalCluster, name: str) -> list[bytes]:
    obj = get_json(cluster, "mutatingwebhookconfiguration", name)
    return [base64.b64decode(w["clientConfig"].get("caBundle", "")) for w in obj["webhooks"]]


def secret_data(cluster: LocalCluster, namespace: str) -> dict[str, bytes]:
    return decode_secret_data(get_json(cluster, "secret", SECRET, "-n", namespace))


def fingerprints(pem: bytes) -> list[str]:
    return [pki.fingerprint(c) for c in pki.load_certs(pem)]


def config(namespace: str, mwc: str | None, **kw: Any) -> CertConfig:
    base: dict[str, Any] = {
        "service": "kubeckpt-webhook",
        "namespace": namespace,
        "secret_name": SECRET,
        "webhook_config_name": mwc,
        "extra_ip_addresses": ("127.0.0.1",),
        "ca_publish_grace": dt.timedelta(seconds=1),
        "resync_interval": 0.3,
    }
    return CertConfig(**(base | kw))


@pytest.fixture
async def api(cluster: LocalCluster) -> AsyncIterator[ClientSecretStore]:
    client = Client.from_kubeconfig(cluster.kubeconfig)
    try:
        yield ClientSecretStore(client)
    finally:
        await client.close()


async def new_api(cluster: LocalCluster, stack: contextlib.AsyncExitStack) -> ClientSecretStore:
    client = Client.from_kubeconfig(cluster.kubeconfig)
    stack.push_async_callback(client.close)
    return ClientSecretStore(client)


class Gate:
    """Holds each replica's first call of `method` until every replica has reached it, so all
    of them have read the Secret before any of them writes: a guaranteed race."""

    def __init__(self, api: ClientSecretStore, barrier: asyncio.Barrier, method: str) -> None:
        self._api, self._barrier, self._method, self._held = api, barrier, method, False
        self.successes = 0

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._api, name)
        if name != self._method:
            return target

        async def gated(*args: Any, **kw: Any) -> Any:
            if not self._held:
                self._held = True
                await self._barrier.wait()
            out = await target(*args, **kw)
            self.successes += 1
            return out

        return gated


class Counting:
    """Delegates to the API and counts successful Secret updates."""

    def __init__(self, api: ClientSecretStore) -> None:
        self._api = api
        self.updates = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    async def update_secret(self, *args: Any, **kw: Any) -> dict[str, Any]:
        out = await self._api.update_secret(*args, **kw)
        self.updates += 1
        return out


async def test_kube_api_preconditions_are_conflicts(
    cluster: LocalCluster, namespace: str, api: ClientSecretStore
) -> None:
    body = {"metadata": {"name": "s"}, "type": "Opaque", "data": {"a": "YQ=="}}
    created = await api.create_secret(namespace, body)
    with pytest.raises(Conflict) as e:
        await api.create_secret(namespace, body)
    assert e.value.status == 409
    stale = created["metadata"]["resourceVersion"]
    await api.update_secret(
        namespace, "s", {**created, "data": {"a": "Yg=="}}, resource_version=stale
    )
    with pytest.raises(Conflict) as e:
        await api.update_secret(namespace, "s", {**created, "data": {}}, resource_version=stale)
    assert e.value.status == 409
    assert await api.get_secret(namespace, "absent") is None
    with webhook_configuration(cluster, (1, 2)) as name:
        mwc = await api.get_webhook_configuration(name)
        assert mwc is not None
        test = {"op": "test", "path": "/metadata/resourceVersion", "value": "1"}
        with pytest.raises(Conflict):
            await api.patch_webhook_configuration(name, [test])


async def test_ca_bundle_is_written_to_every_webhook_entry(
    cluster: LocalCluster, namespace: str, api: ClientSecretStore
) -> None:
    with webhook_configuration(cluster, (free_port(), free_port())) as name:
        mgr = CertManager(api, config(namespace, name))
        r = await mgr.reconcile()
        assert r.created_secret and r.published
        data = secret_data(cluster, namespace)
        assert get_json(cluster, "secret", SECRET, "-n", namespace)["type"] == "kubernetes.io/tls"
        assert set(data) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
        assert ca_bundles(cluster, name) == [data[CA_BUNDLE]] * 2
        leaf = pki.check_pair(data["tls.crt"], data["tls.key"])
        assert pki.issued_by(leaf, pki.load_cert(data[CA_BUNDLE]))
        assert mgr.tls.info is not None
        assert mgr.tls.info.fingerprint_sha256 == pki.fingerprint(leaf)
        # Somebody empties the caBundles (a re-install, a hand edit): the next pass restores them.
        emptied = [{"op": "remove", "path": f"/webhooks/{i}/clientConfig/caBundle"} for i in (0, 1)]
        cluster.kubectl(
            "patch", "mutatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(emptied)
        )
        assert ca_bundles(cluster, name) == [b"", b""]
        r = await mgr.reconcile()
        assert r.published and not r.wrote_secret
        assert ca_bundles(cluster, name) == [data[CA_BUNDLE]] * 2


async def test_two_replicas_racing_on_a_fresh_secret_share_one_certificate(
    cluster: LocalCluster, namespace: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        with webhook_configuration(cluster, (free_port(), free_port())) as name:
            barrier = asyncio.Barrier(2)
            gates = [Gate(await new_api(cluster, stack), barrier, "create_secret") for _ in "ab"]
            mgrs = [CertManager(g, config(namespace, name)) for g in gates]  # type: ignore[arg-type]
            results = await asyncio.gather(*(m.reconcile() for m in mgrs))
            assert sorted(r.created_secret for r in results) == [False, True]
            assert sum(r.conflicts for r in results) >= 1, "the loser met AlreadyExists"
            assert sum(g.successes for g in gates) == 1
            secrets = get_json(cluster, "secrets", "-n", namespace)["items"]
            assert [s["metadata"]["name"] for s in secrets if s["type"] == "kubernetes.io/tls"] == [
                SECRET
            ]
            data = secret_data(cluster, namespace)
            leaf = pki.check_pair(data["tls.crt"], data["tls.key"])
            assert {m.tls.info.fingerprint_sha256 for m in mgrs if m.tls.info} == {
                pki.fingerprint(leaf)
            }
            assert ca_bundles(cluster, name) == [data[CA_BUNDLE]] * 2


async def test_forced_rotation_updates_the_secret_once_and_both_replicas_reload(
    cluster: LocalCluster, namespace: str
) -> None:
    short = {
        "serving_validity": dt.timedelta(minutes=30),
        "ca_validity": dt.timedelta(hours=3),
        "backdate": dt.timedelta(0),
    }
    async with contextlib.AsyncExitStack() as stack:
        with webhook_configuration(cluster, (free_port(), free_port())) as name:
            t0 = dt.datetime.now(dt.UTC)
            first = CertManager(await new_api(cluster, stack), config(namespace, name, **short))
            await first.reconcile(now=t0)
            before = secret_data(cluster, namespace)
            rv_before = get_json(cluster, "secret", SECRET, "-n", namespace)["metadata"][
                "resourceVersion"
            ]
            barrier = asyncio.Barrier(2)
            gates = [Gate(await new_api(cluster, stack), barrier, "update_secret") for _ in "ab"]
            mgrs = [CertManager(g, config(namespace, name, **short)) for g in gates]  # type: ignore[arg-type]
            later = t0 + dt.timedelta(minutes=21)  # 9 of 30 minutes left: renewal due
            results = await asyncio.gather(*(m.reconcile(now=later) for m in mgrs))
            assert sum(g.successes for g in gates) == 1, "one update"
            assert sorted(r.wrote_secret for r in results) == [False, True]
            assert sum(r.conflicts for r in results) == 1, "the loser met the 409 and re-read"
            after = secret_data(cluster, namespace)
            assert after["tls.crt"] != before["tls.crt"]
            assert after[CA_BUNDLE] == before[CA_BUNDLE], "the CA outlives the serving cert"
            meta = get_json(cluster, "secret", SECRET, "-n", namespace)["metadata"]
            assert meta["resourceVersion"] == results[0].resource_version
            assert meta["resourceVersion"] != rv_before
            leaf = pki.check_pair(after["tls.crt"], after["tls.key"])
            assert {m.tls.info.fingerprint_sha256 for m in mgrs if m.tls.info} == {
                pki.fingerprint(leaf)
            }
            # The first replica reloads at its next pass and writes nothing.
            r = await first.reconcile(now=later)
            assert not r.wrote_secret and r.serving.fingerprint_sha256 == pki.fingerprint(leaf)


async def test_run_loops_of_two_replicas_renew_a_short_lived_certificate_once(
    cluster: LocalCluster, namespace: str
) -> None:
    """Real time: a 6 s serving certificate is renewed after 3 s; both replicas' loops race."""
    cfg = config(
        namespace,
        None,
        serving_validity=dt.timedelta(seconds=6),
        ca_validity=dt.timedelta(hours=1),
        renew_fraction=0.5,
        backdate=dt.timedelta(0),
    )
    async with contextlib.AsyncExitStack() as stack:
        stores = [Counting(await new_api(cluster, stack)) for _ in "ab"]
        mgrs = [CertManager(s, cfg) for s in stores]  # type: ignore[arg-type]
        await mgrs[0].reconcile()
        first = mgrs[0].tls.info
        assert first is not None
        tasks = [asyncio.create_task(m.run()) for m in mgrs]
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                infos = {m.tls.info for m in mgrs}
                if len(infos) == 1 and first not in infos:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail(f"replicas did not converge on a renewed certificate: {infos}")
        finally:
            for t in tasks:
                t.cancel()
        (renewed,) = infos
        assert renewed is not None
        assert renewed.not_before >= first.not_before + dt.timedelta(seconds=2)
        assert sum(st.updates for st in stores) == 1, "one renewal written, by one replica"
        data = secret_data(cluster, namespace)
        assert pki.fingerprint(pki.load_cert(data["tls.crt"])) == renewed.fingerprint_sha256


async def test_ca_rotation_keeps_old_and_new_in_the_ca_bundle_during_the_overlap(
    cluster: LocalCluster, namespace: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        with webhook_configuration(cluster, (free_port(), free_port())) as name:
            a, b = [
                CertManager(await new_api(cluster, stack), config(namespace, name)) for _ in "ab"
            ]
            await a.reconcile()
            await b.reconcile()
            (old_ca,) = fingerprints(secret_data(cluster, namespace)[CA_BUNDLE])
            old_leaf = a.tls.info
            r = await a.reconcile(rotate_ca=True)
            assert r.rotation_pending and r.published
            bundle = secret_data(cluster, namespace)[CA_BUNDLE]
            assert fingerprints(bundle)[0] == old_ca and len(fingerprints(bundle)) == 2
            assert ca_bundles(cluster, name) == [bundle] * 2, "old + new, in both entries"
            await b.reconcile()
            assert a.tls.info == b.tls.info == old_leaf, "still signed by the old CA"
            await asyncio.sleep(1.1)  # ca_publish_grace
            r = await a.reconcile()
            assert r.actions[0] == "CA switched: the new CA is published in caBundle"
            assert not r.rotation_pending
            await b.reconcile()
            assert a.tls.info == b.tls.info != old_leaf
            new_ca = fingerprints(bundle)[1]
            assert a.tls.info is not None
            leaf = pki.load_cert(secret_data(cluster, namespace)["tls.crt"])
            assert any(
                pki.issued_by(leaf, c) and pki.fingerprint(c) == new_ca
                for c in pki.load_certs(bundle)
            )
            assert ca_bundles(cluster, name) == [bundle] * 2, "the old CA stays for the overlap"


# --- end to end: the API server itself calls two replicas through every phase ---


def _mutating_app(tag: str) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        review = await request.json()
        patch = [{"op": "add", "path": f"/metadata/labels/served-by-{tag}", "value": "yes"}]
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        )

    app = web.Application()
    app.router.add_post("/mutate/{i}", mutate)
    return app


async def test_the_api_server_trusts_every_phase_of_a_rotation_without_a_failed_request(
    cluster: LocalCluster, namespace: str
) -> None:
    """failurePolicy Fail, one webhook entry per replica: a ConfigMap is created only if the API
    server completed TLS with both replicas. ConfigMaps are created back to back through a serving
    renewal, a CA rotation's publication and its switch; not one may fail."""
    ports = (free_port(), free_port())
    async with contextlib.AsyncExitStack() as stack:
        with webhook_configuration(cluster, ports, failure_policy="Fail") as name:
            mgrs = [
                CertManager(await new_api(cluster, stack), config(namespace, name)) for _ in "ab"
            ]
            for m, port, tag in zip(mgrs, ports, "ab", strict=True):
                await m.reconcile()
                runner = web.AppRunner(_mutating_app(tag), access_log=None)
                await runner.setup()
                stack.push_async_callback(runner.cleanup)
                await web.TCPSite(runner, "127.0.0.1", port, ssl_context=m.tls.context).start()
            client = await new_api(cluster, stack)
            outcomes: list[tuple[int, dict]] = []

            async def create() -> tuple[int, dict]:
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"generateName": "cm-", "labels": {LABEL: name}},
                }
                try:
                    obj = await client.client.request(
                        "POST", f"/api/v1/namespaces/{namespace}/configmaps", json_body=body
                    )
                except ApiError as e:  # e.g. 500: the webhook call failed
                    return e.status, e.body
                return 201, obj

            # The API server picks the new configuration up asynchronously: wait for a success.
            deadline = time.monotonic() + 20
            while True:
                status, obj = await create()
                if status == 201:
                    break
                assert time.monotonic() < deadline, f"webhook never reachable: {status} {obj}"
                await asyncio.sleep(0.2)

            stop = asyncio.Event()

            async def load() -> None:
                while not stop.is_set():
                    outcomes.append(await create())

            loader = asyncio.create_task(load())

            async def settle() -> None:
                await asyncio.sleep(1.2)  # > ca_publish_grace, and requests in between

            a, b = mgrs
            steps: list[str] = []
            await a.reconcile(renew_serving=True)
            steps.append("serving renewed (A)")
            await settle()
            await b.reconcile()
            await settle()
            r = await a.reconcile(rotate_ca=True)
            assert r.rotation_pending
            await settle()
            await b.reconcile()
            await settle()
            r = await a.reconcile()  # the switch: A serves a certificate from the new CA now
            assert r.actions and r.actions[0].startswith("CA switched")
            await settle()  # B still serves the old CA's certificate meanwhile
            await b.reconcile()
            await settle()
            stop.set()
            await loader
            failures = [(s, o.get("message")) for s, o in outcomes if s != 201]
            assert not failures, failures[:3]
            assert len(outcomes) > 20
            for _, obj in outcomes:
                labels = obj["metadata"]["labels"]
                assert labels.get("served-by-a") == labels.get("served-by-b") == "yes"
            # Both replicas now serve a certificate from the new CA, which the API server trusts.
            bundle = secret_data(cluster, namespace)[CA_BUNDLE]
            new_ca = pki.load_certs(bundle)[-1]
            for m in mgrs:
                assert m.tls.info is not None
                assert m.tls.info.issuer == new_ca.subject.rfc4514_string()
