"""Informers on the real control plane converge on the server's state, with every final state
delivered to their handlers: through an API server restart in the middle of a watch while 1,000
ConfigMaps are created, updated and deleted concurrently, and through a 410 Gone forced by an
etcd compaction while the informer was cut off."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from conftest import admin_config, compact_etcd, eventually
from tcpproxy import TcpProxy

from localcluster import LocalCluster
from reconciler.client import Client
from reconciler.errors import AlreadyExists, NotFound, ServerError, TransportError
from reconciler.informer import EventHandler, Informer
from reconciler.metrics import Metrics
from reconciler.objects import KubeObject, object_key, resource_version
from reconciler.ratelimit import Backoff
from reconciler.resources import CONFIGMAPS, ResourceClient


class Recorder:
    """What the handlers were told: the last state delivered per key."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}
        self.counts = {"add": 0, "update": 0, "delete": 0}

    def handler(self) -> EventHandler:
        def put(obj: KubeObject, kind: str) -> None:
            self.state[object_key(obj)] = resource_version(obj)
            self.counts[kind] += 1

        def delete(obj: KubeObject) -> None:
            self.state.pop(object_key(obj), None)
            self.counts["delete"] += 1

        return EventHandler(
            on_add=lambda o: put(o, "add"),
            on_update=lambda _old, new: put(new, "update"),
            on_delete=delete,
        )


def cm(name: str, namespace: str, **data: str) -> KubeObject:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


async def retrying(call: Callable[[], Awaitable[Any]], *, done: tuple[type, ...] = ()) -> None:
    """Retry a write through the API server's restart (a failed POST may still have landed:
    `done` names the errors that mean it did)."""
    for _ in range(300):
        try:
            await call()
            return
        except done:
            return
        except (TransportError, ServerError):
            await asyncio.sleep(0.1)
    raise AssertionError("the API server did not come back")


async def server_state(cms: ResourceClient, namespace: str) -> dict[str, str]:
    listed = await cms.list_all(namespace)
    return {object_key(o): resource_version(o) for o in listed.items}


async def converge(inf: Informer, rec: Recorder, cms: ResourceClient, namespace: str) -> None:
    """Wait until the cache equals a fresh LIST; then the handlers must have been told the same."""
    expected: dict[str, str] = {}
    async with asyncio.timeout(90):
        while True:
            expected = await server_state(cms, namespace)
            cached = {k: resource_version(o) for k, o in inf.store.snapshot().items()}
            if cached == expected:
                break
            await asyncio.sleep(0.3)
    assert rec.state == expected, "every final state was delivered to the handler"


async def test_converges_through_apiserver_restart_during_1000_object_churn(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    cms = client.api(CONFIGMAPS)
    # The informer has its own client (connection pool), as it would in a controller.
    inf_client = Client(admin_config(cluster))
    inf = Informer(inf_client.api(CONFIGMAPS), namespace=namespace, backoff=Backoff(maximum=2.0))
    rec = Recorder()
    inf.add_handler(rec.handler())
    running = asyncio.create_task(inf.run())
    try:
        async with asyncio.timeout(30):
            await inf.wait_for_sync()
        sem = asyncio.Semaphore(48)

        async def life(i: int) -> None:
            name = f"cm-{i:04d}"
            async with sem:
                await retrying(
                    functools.partial(cms.create, cm(name, namespace, v="0")), done=(AlreadyExists,)
                )
                for v in ("1", "2"):
                    await retrying(
                        functools.partial(cms.patch, name, {"data": {"v": v}}, namespace)
                    )
                if i % 3 == 0:
                    await retrying(functools.partial(cms.delete, name, namespace), done=(NotFound,))

        churn = asyncio.gather(*(life(i) for i in range(1000)))
        await eventually(  # restart in the middle of the churn, with the watch busy
            lambda: sum(inf.stats.events.values()) >= 600, "churn events", within=60
        )
        watches_before = inf.stats.watches
        await asyncio.to_thread(cluster.restart_apiserver)
        await churn
        await converge(inf, rec, cms, namespace)
        assert len(inf.store) == 1 + 1000 - 334  # kube-root-ca.crt, and the survivors
        assert all(
            o["data"]["v"] == "2" for o in inf.store if o["metadata"]["name"] != "kube-root-ca.crt"
        )
        assert inf.stats.watches > watches_before, "the watch was made again after the restart"
        assert inf.stats.watch_errors + inf.stats.gone >= 1
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await inf_client.close()


async def test_relists_after_410_from_compaction_and_delivers_the_differences(
    cluster: LocalCluster, client: Client, namespace: str
) -> None:
    cms = client.api(CONFIGMAPS)
    # The root-CA publisher adds kube-root-ca.crt to every new namespace, late under load: wait
    # for it, or it may land during the cut-off below and count as one more synthetic add.
    for _ in range(300):
        names = {o["metadata"]["name"] for o in (await cms.list(namespace))["items"]}
        if "kube-root-ca.crt" in names:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("kube-root-ca.crt never appeared in the test namespace")
    for i in range(40):
        await cms.create(cm(f"c{i:02d}", namespace, v="0"))
    apiserver_port = int(cluster.server.rsplit(":", 1)[1])
    proxy = TcpProxy("127.0.0.1", apiserver_port)
    port = await proxy.start()
    # The informer reaches the API server only through the proxy, so the test can cut it off.
    inf_client = Client(admin_config(cluster, server=f"https://127.0.0.1:{port}"))
    metrics = Metrics()
    inf = Informer(inf_client.api(CONFIGMAPS), namespace=namespace, backoff=Backoff(maximum=2.0))
    metrics.informers["cms"] = inf
    rec = Recorder()
    inf.add_handler(rec.handler())
    running = asyncio.create_task(inf.run())
    try:
        async with asyncio.timeout(30):
            await inf.wait_for_sync()
        await cms.patch("c00", {"data": {"v": "seen"}}, namespace)
        await eventually(
            lambda: inf.store.get(f"{namespace}/c00")["data"]["v"] == "seen",  # type: ignore[index]
            "the watch to deliver an update",
            within=10,
        )
        rv_before = inf.last_resource_version
        synthetic_before = dict(inf.stats.synthetic)

        await proxy.stop()  # cut off: what follows is missed by the watch
        for i in range(10):
            await cms.patch(f"c{i:02d}", {"data": {"v": "missed"}}, namespace)
        for i in range(10, 20):
            await cms.delete(f"c{i:02d}", namespace)
        for i in range(5):
            await cms.create(cm(f"new{i}", namespace))
        # Make rv_before too old for anyone: etcd compacts past it, and the restarted API server's
        # watch cache starts after it, so the informer's resumed watch must get 410 Gone.
        await asyncio.to_thread(compact_etcd, cluster)
        await asyncio.to_thread(cluster.restart_apiserver)
        await proxy.start()

        await converge(inf, rec, cms, namespace)
        assert inf.stats.gone >= 1, "the resumed watch got 410 Gone"
        assert inf.stats.relists >= 1
        assert metrics.value("informer_gone_total", {"informer": "cms"}) == inf.stats.gone
        assert metrics.value("informer_relists_total", {"informer": "cms"}) == inf.stats.relists
        assert int(inf.last_resource_version) > int(rv_before)
        synthetic = {k: v - synthetic_before.get(k, 0) for k, v in inf.stats.synthetic.items()}
        assert synthetic == {"update": 10, "delete": 10, "add": 5}, synthetic
        assert all(
            inf.store.get(f"{namespace}/c{i:02d}")["data"]["v"] == "missed" for i in range(10)
        )  # type: ignore[index]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await inf_client.close()
        await proxy.stop()


async def test_selectors_indexes_and_late_handlers(client: Client, namespace: str) -> None:
    cms = client.api(CONFIGMAPS)

    def labelled(name: str, **labels: str) -> KubeObject:
        obj = cm(name, namespace)
        obj["metadata"]["labels"] = labels
        return obj

    await cms.create(labelled("a", app="web", tier="front"))
    await cms.create(labelled("b", app="web", tier="back"))
    await cms.create(labelled("c", app="db", tier="back"))
    await cms.create(labelled("skip", app="web", tier="front"))
    from reconciler.cache import label_index

    inf = Informer(
        cms,
        namespace=namespace,
        label_selector="app=web",
        field_selector="metadata.name!=skip",
        indexers={"tier": label_index("tier")},
        page_size=1,  # exercise pagination of the initial list
    )
    running = asyncio.create_task(inf.run())
    try:
        async with asyncio.timeout(30):
            await inf.wait_for_sync()
        assert sorted(inf.store.keys()) == [f"{namespace}/a", f"{namespace}/b"]
        assert [o["metadata"]["name"] for o in inf.store.by_index("tier", "back")] == ["b"]
        late = Recorder()
        inf.add_handler(late.handler())
        assert late.counts["add"] == 2, "a late handler first hears of every cached object"
        # Relabelled out of the selector: a DELETED for this watch.
        await cms.patch("b", {"metadata": {"labels": {"app": "other"}}}, namespace)
        await cms.patch("c", {"metadata": {"labels": {"app": "web"}}}, namespace)
        await eventually(
            lambda: sorted(inf.store.keys()) == [f"{namespace}/a", f"{namespace}/c"],
            "the relabelled objects to move in and out of the selection",
            within=10,
        )
        assert inf.store.index_keys("tier", "back") == {f"{namespace}/c"}
        assert late.counts == {"add": 3, "update": 0, "delete": 1}
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
