"""The manager: runs informers, controllers, event recorders and other runnables; serves /healthz,
/readyz and /metrics; and, with leader election, runs controllers only while leading.

- Informers and event recorders run on every replica (a standby keeps a warm cache, as in
  controller-runtime); controllers and `leader_only` runnables only on the leader, started once
  every informer has synced.
- /readyz answers 200 once every informer has synced; /healthz while the manager runs.
- `stop()` (or SIGTERM with `install_signal_handlers`) shuts down in order: controllers drain their
  queues (up to `drain_timeout`), then the Lease is released, then informers stop.
- On losing the Lease, controllers are cancelled at once (no drain) and the manager campaigns
  again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .cache import IndexFunc
from .client import Client
from .controller import Controller, Reconcile
from .events import EventRecorder
from .informer import Informer
from .leaderelection import LeaderElectionConfig, LeaderElector
from .metrics import Metrics
from .metrics_auth import MetricsAuth
from .resources import ResourceClient
from .transform import Transform

log = logging.getLogger(__name__)

Runnable = Callable[[], Awaitable[None]]


class Manager:
    def __init__(
        self,
        client: Client,
        *,
        name: str = "manager",
        leader_election: LeaderElectionConfig | None = None,
        host: str = "0.0.0.0",
        port: int | None = 8081,
        drain_timeout: float = 10.0,
        metrics: Metrics | None = None,
        metrics_port: int | None = None,
        metrics_tls: ssl.SSLContext | None = None,
        metrics_auth: MetricsAuth | None = None,
    ) -> None:
        """`metrics_port`: serve /metrics there instead of beside the probes, over TLS with
        `metrics_tls` and, with `metrics_auth`, only to callers the API server allows
        (metrics_auth.py; closed with the manager). The probes stay plain HTTP on `port`: the
        kubelet probes them."""
        self.client = client
        self.name = name
        self.metrics = metrics or Metrics()
        self.metrics.client = client
        self.host = host
        self.port = port
        self.metrics_port = metrics_port
        self.metrics_tls = metrics_tls
        self.metrics_auth = metrics_auth
        self.drain_timeout = drain_timeout
        # The elector has a client (session, pool, rate limit) of its own: a Lease renewal never
        # waits behind the controllers' requests or /metrics' token reviews.
        self.elector = (
            LeaderElector(
                client.derived(user_agent=f"{client.config.user_agent} leader-election"),
                leader_election,
            )
            if leader_election is not None
            else None
        )
        if self.elector is not None:
            self.metrics.electors[leader_election.lease_name] = self.elector  # type: ignore[union-attr]
        self.informers: dict[tuple[Any, ...], Informer] = {}
        self.controllers: list[Controller] = []
        self.recorders: list[EventRecorder] = []
        self._leader_runnables: list[Runnable] = []
        self._runnables: list[Runnable] = []
        self._stop = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self.bound_metrics_port: int | None = None
        self._leading = False

    # --- building ---
    def informer(
        self,
        api: ResourceClient,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexers: dict[str, IndexFunc] | None = None,
        transform: Transform | None = None,
        **kwargs: Any,
    ) -> Informer:
        """The shared informer for this resource and selection (one watch however many
        controllers use it); `indexers` are added to it. `transform` trims what its cache
        keeps (reconciler/transform.py); every user of a shared informer must ask for the same
        one (a ValueError otherwise: one would read fields the other dropped)."""
        key = (api.resource, namespace, label_selector, field_selector)
        inf = self.informers.get(key)
        if inf is not None and inf.transform is not transform:
            raise ValueError(f"the informer {inf.name} exists with another transform")
        if inf is None:
            inf = Informer(
                api,
                namespace=namespace,
                label_selector=label_selector,
                field_selector=field_selector,
                transform=transform,
                **kwargs,
            )
            name = inf.name
            n = 2
            while name in self.metrics.informers:
                name, n = f"{inf.name}#{n}", n + 1
            inf.name = name
            self.informers[key] = inf
            self.metrics.informers[name] = inf
        if indexers:
            inf.add_indexers(indexers)
        return inf

    def controller(
        self, name: str, reconcile: Reconcile, *, workers: int = 1, **kw: Any
    ) -> Controller:
        ctrl = Controller(name, reconcile, workers=workers, metrics=self.metrics, **kw)
        self.add_controller(ctrl)
        return ctrl

    def add_controller(self, controller: Controller) -> None:
        if any(c.name == controller.name for c in self.controllers):
            raise ValueError(f"a controller named {controller.name!r} exists")
        controller.metrics = self.metrics
        self.controllers.append(controller)

    def event_recorder(self, component: str, **kw: Any) -> EventRecorder:
        rec = EventRecorder(self.client, component, **kw)
        self.recorders.append(rec)
        self.metrics.recorders.append(rec)
        return rec

    def add_runnable(self, fn: Runnable, *, leader_only: bool = True) -> None:
        (self._leader_runnables if leader_only else self._runnables).append(fn)

    # --- state ---
    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def synced(self) -> bool:
        return all(i.has_synced for i in self.informers.values())

    def stop(self) -> None:
        """Ask `run()` to shut down in order (safe to call from a signal handler)."""
        self._stop.set()

    # --- running ---
    async def run(self) -> None:
        """Run until `stop()`; returns after an orderly shutdown."""
        self._stop.clear()
        await self._start_http()
        background = [
            asyncio.create_task(i.run(), name=f"informer:{i.name}") for i in self.informers.values()
        ]
        background += [asyncio.create_task(r.run()) for r in self.recorders]
        background += [asyncio.create_task(fn()) for fn in self._runnables]
        if self.elector is not None:
            leading = asyncio.create_task(self.elector.run(self._lead), name="leader-election")
        else:
            leading = asyncio.create_task(self._lead(), name="lead")
        stop = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait(
                [stop, leading, *background], return_when=asyncio.FIRST_COMPLETED
            )
            for t in done:
                if t is not stop and not t.cancelled() and t.exception() is not None:
                    log.error("%s: %s failed: %r", self.name, t.get_name(), t.exception())
        finally:
            # 1. controllers drain and stop, 2. the Lease is released, 3. the rest stops.
            await asyncio.gather(
                *(c.stop(self.drain_timeout) for c in self.controllers), return_exceptions=True
            )
            leading.cancel()
            await asyncio.gather(leading, return_exceptions=True)
            for rec in self.recorders:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2.0):
                        await rec.flush()
            stop.cancel()
            for t in background:
                t.cancel()
            await asyncio.gather(stop, *background, return_exceptions=True)
            await self._stop_http()
            if self.elector is not None:
                await self.elector.client.close()  # its own (derived) client, last

    async def _lead(self) -> None:
        """Run while leading: wait for the caches, then controllers and leader-only runnables."""
        await self._wait_synced()
        self._leading = True
        tasks = [
            asyncio.create_task(c.run(), name=f"controller:{c.name}") for c in self.controllers
        ]
        tasks += [asyncio.create_task(fn()) for fn in self._leader_runnables]
        try:
            if tasks:
                await asyncio.gather(*tasks)
            else:
                await asyncio.Event().wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._leading = False

    async def _wait_synced(self) -> None:
        await asyncio.gather(*(i.wait_for_sync() for i in self.informers.values()))

    # --- http ---
    async def _start_http(self) -> None:
        if self.port is not None:
            app = web.Application()
            app.router.add_get("/healthz", self._healthz)
            app.router.add_get("/readyz", self._readyz)
            if self.metrics_port is None:
                app.router.add_get("/metrics", self._metrics)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, self.port).start()
            self.bound_port = self._runner.addresses[0][1]  # the real one when port is 0
        if self.metrics_port is not None:
            app = web.Application()
            handler = self._metrics
            if self.metrics_auth is not None:
                handler = self.metrics_auth.protect(handler)  # type: ignore[assignment]
            app.router.add_get("/metrics", handler)
            self._metrics_runner = web.AppRunner(app, access_log=None)
            await self._metrics_runner.setup()
            site = web.TCPSite(
                self._metrics_runner, self.host, self.metrics_port, ssl_context=self.metrics_tls
            )
            await site.start()
            self.bound_metrics_port = self._metrics_runner.addresses[0][1]

    async def _stop_http(self) -> None:
        for runner in (self._runner, self._metrics_runner):
            if runner is not None:
                await runner.cleanup()
        self._runner = self._metrics_runner = None
        if self.metrics_auth is not None:
            await self.metrics_auth.close()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, _: web.Request) -> web.Response:
        waiting = [i.name for i in self.informers.values() if not i.has_synced]
        if waiting:
            return web.Response(status=503, text="informers not synced: " + ", ".join(waiting))
        return web.Response(text="ok")

    async def _metrics(self, _: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )


def install_signal_handlers(manager: Manager) -> None:
    """SIGTERM and SIGINT stop the manager in order (call inside the running loop)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, manager.stop)
