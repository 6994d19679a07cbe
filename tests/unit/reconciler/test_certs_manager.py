"""CertManager against an in-memory API with the server's concurrency rules (resourceVersion
preconditions, AlreadyExists, JSON patch `test`): replicas racing, rotation, publication."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import itertools
from typing import Any

import jsonpatch
import pytest

from reconciler import pki
from reconciler.admission import (
    CA_BUNDLE,
    CertConfig,
    CertManager,
    Conflict,
    StoreError,
    decode_secret_data,
)

NS, SECRET, MWC = "kubeckpt-system", "kubeckpt-webhook-certs", "kubeckpt-webhook"
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def config(**kw: Any) -> CertConfig:
    base: dict[str, Any] = {
        "service": "kubeckpt-webhook",
        "namespace": NS,
        "secret_name": SECRET,
        "webhook_config_name": MWC,
        "extra_ip_addresses": ("127.0.0.1",),
        "serving_validity": 90 * DAY,
        "ca_validity": 365 * DAY,
        "ca_publish_grace": dt.timedelta(seconds=30),
        "backdate": dt.timedelta(0),
    }
    return CertConfig(**(base | kw))


class FakeAPI:
    """One Secret namespace and the webhook configurations, with the API server's preconditions."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.mwcs: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(1)
        self.writes: list[str] = []
        self.fail_with: StoreError | None = None
        self.mwc_error: StoreError | None = None

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
        return obj

    def add_mwc(self, name: str = MWC, entries: int = 2) -> None:
        webhooks = [
            {"name": f"w{i}.kubeckpt.io", "clientConfig": {"url": f"https://127.0.0.1/{i}"}}
            for i in range(entries)
        ]
        self.mwcs[name] = self._stamp({"metadata": {"name": name}, "webhooks": webhooks})

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)
        if self.fail_with:
            raise self.fail_with
        obj = self.secrets.get((namespace, name))
        return copy.deepcopy(obj)

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        key = (namespace, body["metadata"]["name"])
        if key in self.secrets:
            raise Conflict("AlreadyExists", 409)
        self.secrets[key] = self._stamp(copy.deepcopy(body))
        self.writes.append("create")
        return copy.deepcopy(self.secrets[key])

    async def update_secret(
        self, namespace: str, name: str, body: dict[str, Any], *, resource_version: str
    ) -> dict[str, Any]:
        await asyncio.sleep(0)
        cur = self.secrets.get((namespace, name))
        if cur is None:
            raise Conflict("NotFound", 404)
        if cur["metadata"]["resourceVersion"] != resource_version:
            raise Conflict("the object has been modified", 409)
        self.secrets[(namespace, name)] = self._stamp(copy.deepcopy(body))
        self.writes.append("update")
        return copy.deepcopy(self.secrets[(namespace, name)])

    async def get_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)
        if self.mwc_error:
            raise self.mwc_error
        return copy.deepcopy(self.mwcs.get(name))

    async def patch_webhook_configuration(
        self, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        await asyncio.sleep(0)
        try:
            new = jsonpatch.apply_patch(self.mwcs[name], patch)
        except jsonpatch.JsonPatchTestFailed as e:
            raise Conflict(str(e), 422) from e
        self.mwcs[name] = self._stamp(new)
        self.writes.append("patch")
        return copy.deepcopy(new)

    def bundle(self) -> bytes:
        return decode_secret_data(self.secrets[(NS, SECRET)])[CA_BUNDLE]

    def mwc_bundles(self) -> list[bytes]:
        return [
            base64.b64decode(w["clientConfig"].get("caBundle", ""))
            for w in self.mwcs[MWC]["webhooks"]
        ]


class Gate:
    """Delegates to the API, but holds the first call of `method` until `parties` replicas have
    reached it: every replica has read before any of them writes."""

    def __init__(self, api: FakeAPI, barrier: asyncio.Barrier, method: str) -> None:
        self._api, self._barrier, self._method, self._held = api, barrier, method, False

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._api, name)
        if name != self._method:
            return target

        async def gated(*args: Any, **kw: Any) -> Any:
            if not self._held:
                self._held = True
                await self._barrier.wait()
            return await target(*args, **kw)

        return gated


async def test_first_reconcile_creates_the_secret_serves_it_and_publishes_to_every_entry() -> None:
    api = FakeAPI()
    api.add_mwc(entries=3)
    mgr = CertManager(api, config(), clock=lambda: T0)
    assert not mgr.tls.ready
    r = await mgr.reconcile()
    assert r.created_secret and r.wrote_secret and r.published and r.conflicts == 0
    assert r.actions == ("CA created", "serving certificate issued: none usable in the Secret")
    secret = api.secrets[(NS, SECRET)]
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert mgr.tls.ready and mgr.tls.ca_bundle == api.bundle()
    assert api.mwc_bundles() == [api.bundle()] * 3
    assert r.serving.dns_names == (
        "kubeckpt-webhook.kubeckpt-system.svc",
        "kubeckpt-webhook.kubeckpt-system.svc.cluster.local",
    )
    assert r.serving.ip_addresses == ("127.0.0.1",)
    again = await mgr.reconcile()
    assert not again.wrote_secret and not again.published and again.actions == ()
    assert api.writes == ["create", "patch"]


@pytest.mark.parametrize("replicas", [2, 5])
async def test_replicas_racing_on_a_fresh_secret_end_with_one_secret_and_one_certificate(
    replicas: int,
) -> None:
    api = FakeAPI()
    api.add_mwc()
    barrier = asyncio.Barrier(replicas)
    mgrs = [
        CertManager(Gate(api, barrier, "create_secret"), config(), clock=lambda: T0)  # type: ignore[arg-type]
        for _ in range(replicas)
    ]
    results = await asyncio.gather(*(m.reconcile() for m in mgrs))
    assert api.writes.count("create") == 1 and "update" not in api.writes
    assert sum(r.created_secret for r in results) == 1
    assert sum(r.conflicts for r in results) == replicas - 1, "every loser met the 409"
    assert len({m.tls.info.fingerprint_sha256 for m in mgrs if m.tls.info}) == 1
    assert all(m.tls.ca_bundle == api.bundle() for m in mgrs)
    assert api.mwc_bundles() == [api.bundle()] * 2


async def test_a_due_renewal_is_written_once_and_every_replica_serves_it() -> None:
    api = FakeAPI()
    api.add_mwc()
    a = CertManager(api, config(), clock=lambda: T0)
    await a.reconcile()
    old = a.tls.info
    assert old is not None
    barrier = asyncio.Barrier(2)
    later = T0 + 61 * DAY
    mgrs = [
        CertManager(Gate(api, barrier, "update_secret"), config(), clock=lambda: later)  # type: ignore[arg-type]
        for _ in range(2)
    ]
    writes_before = len(api.writes)
    results = await asyncio.gather(*(m.reconcile() for m in mgrs))
    assert api.writes[writes_before:] == ["update"], "one renewal, no caBundle change"
    assert sorted(r.wrote_secret for r in results) == [False, True]
    assert sum(r.conflicts for r in results) == 1
    infos = {m.tls.info.fingerprint_sha256 for m in mgrs if m.tls.info}
    assert len(infos) == 1 and old.fingerprint_sha256 not in infos
    # The first replica reloads it at its next pass, writing nothing.
    r = await a.reconcile(now=later)
    assert not r.wrote_secret and a.tls.info.fingerprint_sha256 in infos


async def test_a_forced_renewal_that_lost_the_race_adopts_the_winner() -> None:
    api = FakeAPI()
    api.add_mwc()
    await CertManager(api, config(), clock=lambda: T0).reconcile()
    barrier = asyncio.Barrier(2)
    mgrs = [
        CertManager(Gate(api, barrier, "update_secret"), config(), clock=lambda: T0)  # type: ignore[arg-type]
        for _ in range(2)
    ]
    results = await asyncio.gather(*(m.reconcile(renew_serving=True) for m in mgrs))
    assert api.writes.count("update") == 1
    assert sum(r.conflicts for r in results) == 1
    assert mgrs[0].tls.info == mgrs[1].tls.info


async def test_ca_rotation_switches_only_after_the_bundle_was_published_for_the_grace() -> None:
    api = FakeAPI()
    api.add_mwc()
    cfg = config()
    a = CertManager(api, cfg, clock=lambda: T0)
    b = CertManager(api, cfg, clock=lambda: T0)
    await a.reconcile()
    await b.reconcile()
    first = a.tls.info
    now = T0 + DAY
    r = await a.reconcile(now=now, rotate_ca=True)
    assert r.actions == ("CA rotation started: new CA added to the bundle",)
    assert r.rotation_pending and r.published
    assert len(pki.load_certs(api.bundle())) == 2
    assert api.mwc_bundles() == [api.bundle()] * 2
    assert a.tls.info == first, "still the old CA's serving certificate"
    # B sees the bundle published now and starts its own count; neither switches early.
    for m in (a, b):
        r = await m.reconcile(now=now + dt.timedelta(seconds=29))
        assert not r.wrote_secret and r.rotation_pending
    r = await a.reconcile(now=now + dt.timedelta(seconds=30))
    assert r.actions == (
        "CA switched: the new CA is published in caBundle",
        "serving certificate issued: not signed by the current CA",
    )
    assert not r.published, "the bundle (old + new) was already published"
    assert len(pki.load_certs(api.bundle())) == 2
    r = await b.reconcile(now=now + dt.timedelta(seconds=31))
    assert not r.wrote_secret and b.tls.info == a.tls.info != first


async def test_no_switch_while_the_configuration_is_missing_or_lacks_the_new_ca() -> None:
    api = FakeAPI()
    m = CertManager(api, config(), clock=lambda: T0)
    await m.reconcile()  # no configuration yet: certificates work, nothing is published
    r = await m.reconcile(rotate_ca=True)
    assert r.rotation_pending and not r.published
    r = await m.reconcile(now=T0 + DAY)
    assert r.rotation_pending and not r.wrote_secret
    # Someone re-applies the configuration later: we publish, then count the grace from there.
    api.add_mwc()
    r = await m.reconcile(now=T0 + 2 * DAY)
    assert r.published and r.rotation_pending
    r = await m.reconcile(now=T0 + 2 * DAY + dt.timedelta(seconds=30))
    assert not r.rotation_pending and r.wrote_secret


async def test_a_replica_with_an_older_secret_never_writes_an_older_bundle_back() -> None:
    """B reads the configuration and the Secret, then A rotates the CA and publishes, then B
    decides: B must not put the one-CA bundle back."""
    api = FakeAPI()
    api.add_mwc()
    a = CertManager(api, config(), clock=lambda: T0)
    await a.reconcile()
    b_read = asyncio.Event()
    a_done = asyncio.Event()

    class Slow:
        def __getattr__(self, name: str) -> Any:
            return getattr(api, name)

        async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
            secret = await api.get_secret(namespace, name)
            if not b_read.is_set():
                b_read.set()
                await a_done.wait()
            return secret

    b = CertManager(Slow(), config(), clock=lambda: T0)  # type: ignore[arg-type]
    b_task = asyncio.create_task(b.reconcile())
    await b_read.wait()
    await a.reconcile(rotate_ca=True)
    a_done.set()
    await b_task
    assert api.mwc_bundles() == [api.bundle()] * 2
    assert len(pki.load_certs(api.mwc_bundles()[0])) == 2


async def test_a_configuration_changed_between_read_and_patch_is_re_read() -> None:
    api = FakeAPI()
    api.add_mwc()
    m = CertManager(api, config(), clock=lambda: T0)
    await m.reconcile()
    for w in api.mwcs[MWC]["webhooks"]:  # someone re-applies the manifest without caBundle
        w["clientConfig"].pop("caBundle")
    real_patch = api.patch_webhook_configuration
    raced: list[bool] = []

    async def racing_patch(name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        if not raced:  # and edits it again just before our first patch lands
            raced.append(True)
            api._stamp(api.mwcs[name])
        return await real_patch(name, patch)

    api.patch_webhook_configuration = racing_patch  # type: ignore[method-assign]
    r = await m.reconcile()
    assert r.conflicts == 1 and r.published
    assert api.mwc_bundles() == [api.bundle()] * 2


async def test_an_empty_secret_from_the_manifests_is_filled_in_not_recreated() -> None:
    api = FakeAPI()
    api.secrets[(NS, SECRET)] = api._stamp(
        {
            "metadata": {"name": SECRET, "namespace": NS, "labels": {"mine": "yes"}},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "", "tls.key": ""},
        }
    )
    r = await CertManager(api, config(webhook_config_name=None), clock=lambda: T0).reconcile()
    assert r.wrote_secret and not r.created_secret and api.writes == ["update"]
    assert api.secrets[(NS, SECRET)]["metadata"]["labels"] == {"mine": "yes"}


async def test_errors_keep_the_loaded_certificate_and_run_retries() -> None:
    api = FakeAPI()
    api.add_mwc()
    m = CertManager(api, config(resync_interval=0.01), clock=lambda: T0)
    await m.reconcile()
    served = m.tls.info
    api.fail_with = StoreError("connection refused")
    with pytest.raises(StoreError):
        await m.reconcile()
    assert m.tls.info == served and m.tls.ready
    task = asyncio.create_task(m.run())
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if m.last_error:
                break
        assert m.last_error and "connection refused" in m.last_error
        api.fail_with = None
        m.trigger()
        for _ in range(300):
            await asyncio.sleep(0.01)
            if m.last_error is None:
                break
        assert m.last_error is None
    finally:
        task.cancel()


async def test_run_reloads_what_another_replica_wrote() -> None:
    api = FakeAPI()
    api.add_mwc()
    a = CertManager(api, config(), clock=lambda: T0)
    b = CertManager(api, config(resync_interval=0.02), clock=lambda: T0)
    await a.reconcile()
    task = asyncio.create_task(b.run())
    try:
        await asyncio.wait_for(b.tls.wait_ready(), 2)
        changed = asyncio.create_task(b.tls.wait_changed())
        await a.reconcile(renew_serving=True)
        info = await asyncio.wait_for(changed, 2)
        assert info == a.tls.info
    finally:
        task.cancel()


async def test_an_unreadable_configuration_blocks_publishing_and_the_switch_not_serving() -> None:
    api = FakeAPI()
    api.add_mwc()
    api.mwc_error = StoreError("forbidden", 403)
    m = CertManager(api, config(), clock=lambda: T0)
    r = await m.reconcile()
    assert r.created_secret and m.tls.ready and not r.published
    assert r.publish_error == "forbidden"
    await m.reconcile(rotate_ca=True)
    r = await m.reconcile(now=T0 + DAY)
    assert r.rotation_pending, "no switch while the bundle cannot be seen published"
    api.mwc_error = None
    r = await m.reconcile(now=T0 + DAY)
    assert r.published and r.publish_error is None and r.rotation_pending
