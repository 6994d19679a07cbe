"""Manager probes with an informer that cannot sync (its API server is unreachable): healthy but
not ready, and an orderly stop even so. No cluster needed."""

from __future__ import annotations

import asyncio

import aiohttp

from reconciler import Client, ClientConfig, Manager
from reconciler.ratelimit import Backoff
from reconciler.resources import CONFIGMAPS


async def test_not_ready_until_informers_sync_and_stops_in_order() -> None:
    client = Client(ClientConfig("http://127.0.0.1:9", qps=None, max_retries=0))
    mgr = Manager(client, host="127.0.0.1", port=0)
    mgr.informer(client.api(CONFIGMAPS), namespace="x", backoff=Backoff(maximum=0.2))
    mgr.informer(client.api(CONFIGMAPS), namespace="x")  # shared: the same informer
    assert len(mgr.informers) == 1
    running = asyncio.create_task(mgr.run())
    try:
        for _ in range(100):
            if mgr.bound_port:
                break
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{mgr.bound_port}"
            async with http.get(base + "/healthz") as r:
                assert r.status == 200
            async with http.get(base + "/readyz") as r:
                assert r.status == 503
                assert "configmaps/x" in await r.text()
            async with http.get(base + "/metrics") as r:
                assert 'informer_synced{informer="configmaps/x"} 0.0' in await r.text()
    finally:
        mgr.stop()
        await asyncio.wait_for(running, 10)
        await client.close()
    assert not mgr.is_leader
