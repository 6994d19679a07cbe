"""Controllers: informer events become requests in a rate-limited work queue, and N workers call
`reconcile(request)` (controller-runtime's model).

- A request is (namespace, name); the work queue guarantees one worker per request at a time and
  collapses repeats, so reconcile is level-based: read the current state, act, return.
- `Result(requeue_after=s)` reconciles again after s seconds; `Result(requeue=True)` or an
  exception requeues with the rate limiter's backoff (5 ms doubling to 1000 s per request, and
  10/s overall); success forgets the request's backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .clock import REAL_CLOCK, Clock
from .informer import EventHandler, Informer
from .objects import KubeObject, meta, name_of, namespace_of, split_key
from .ratelimit import RateLimiter, default_controller_rate_limiter
from .workqueue import ShutDown, WorkQueue

if TYPE_CHECKING:
    from .metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Request:
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        return self.key

    @classmethod
    def from_object(cls, obj: KubeObject) -> Request:
        return cls(namespace_of(obj), name_of(obj))

    @classmethod
    def from_key(cls, key: str) -> Request:
        return cls(*split_key(key))


@dataclass(frozen=True)
class Result:
    requeue: bool = False
    requeue_after: float | None = None


Reconcile = Callable[[Request], Awaitable[Result | None]]
Mapper = Callable[[KubeObject], Iterable[Request]]
UpdatePredicate = Callable[[KubeObject, KubeObject], bool]


def own_object(obj: KubeObject) -> list[Request]:
    """Map an object to a request for itself (controller-runtime's EnqueueRequestForObject)."""
    return [Request.from_object(obj)]


def owner_of(kind: str, api_group: str | None = None) -> Mapper:
    """Map an object to requests for its owners of `kind` (optionally of one API group), so a
    change to a pod reconciles the job that owns it."""

    def mapper(obj: KubeObject) -> list[Request]:
        out = []
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("kind") != kind:
                continue
            if api_group is not None and ref.get("apiVersion", "").rpartition("/")[0] != api_group:
                continue
            out.append(Request(namespace_of(obj), ref.get("name", "")))
        return out

    return mapper


def generation_changed(old: KubeObject, new: KubeObject, *, deletion: bool = False) -> bool:
    """An update predicate (controller-runtime's GenerationChangedPredicate): only a spec edit
    bumps metadata.generation, a status write never does, so a controller that writes the status
    of the objects it watches is not woken again by its own writes. With `deletion`, the update
    that sets (or changes) metadata.deletionTimestamp passes too."""
    om, nm = meta(old), meta(new)
    if om.get("generation") != nm.get("generation"):
        return True
    return deletion and om.get("deletionTimestamp") != nm.get("deletionTimestamp")


class Controller:
    def __init__(
        self,
        name: str,
        reconcile: Reconcile,
        *,
        workers: int = 1,
        clock: Clock = REAL_CLOCK,
        rate_limiter: Callable[[], RateLimiter] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.metrics = metrics
        self._clock = clock
        self._new_limiter = rate_limiter or (lambda: default_controller_rate_limiter(clock))
        self._sources: list[tuple[Informer, Mapper]] = []
        self._queue: WorkQueue[Request] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def queue(self) -> WorkQueue[Request] | None:
        """The queue of the current run (None while stopped: a fresh one is made per run, so a
        controller can stop on losing leadership and start again)."""
        return self._queue

    @property
    def running(self) -> bool:
        return self._queue is not None

    def watch(
        self,
        informer: Informer,
        mapper: Mapper = own_object,
        *,
        update_predicate: UpdatePredicate | None = None,
    ) -> None:
        """Reconcile the requests `mapper` makes of each object `informer` adds, updates (when
        `update_predicate(old, new)` holds) or deletes."""

        def enqueue(obj: KubeObject) -> None:
            q = self._queue
            if q is not None:
                for req in mapper(obj):
                    q.add(req)

        def on_update(old: KubeObject, new: KubeObject) -> None:
            if update_predicate is None or update_predicate(old, new):
                enqueue(new)

        informer.add_handler(EventHandler(on_add=enqueue, on_update=on_update, on_delete=enqueue))
        self._sources.append((informer, mapper))

    def enqueue(self, request: Request, after: float = 0.0) -> None:
        if self._queue is not None:
            self._queue.add_after(request, after)

    async def run(self) -> None:
        """Run the workers until `stop()` or cancellation. Every object already in a watched
        informer's cache is queued first (the informers should have synced)."""
        if self._queue is not None:
            raise RuntimeError(f"controller {self.name} is already running")
        queue: WorkQueue[Request] = WorkQueue(
            self.name, clock=self._clock, rate_limiter=self._new_limiter()
        )
        if self.metrics is not None:
            self.metrics.queues[self.name] = queue
            queue.observe_wait = self.metrics.queue_wait.labels(self.name).observe
        self._queue = queue
        for informer, mapper in self._sources:
            for obj in informer.store:
                for req in mapper(obj):
                    queue.add(req)
        self._tasks = [asyncio.create_task(self._worker(queue)) for _ in range(self.workers)]
        try:
            # Workers end when the queue shuts down (stop) or are cancelled (stop without drain).
            results = await asyncio.gather(*self._tasks, return_exceptions=True)
            for r in results:
                if isinstance(r, Exception):
                    log.error("%s: worker failed: %r", self.name, r)
        finally:
            queue.shutdown()
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks = []
            self._queue = None

    async def stop(self, drain_timeout: float = 0.0) -> None:
        """Stop taking requests; let workers finish what is queued and in flight for up to
        `drain_timeout` seconds, then cancel them. `run()` returns once they are gone."""
        queue = self._queue
        if queue is None:
            return
        drained = False
        if drain_timeout > 0:
            try:
                async with asyncio.timeout(drain_timeout):
                    await queue.shutdown_with_drain()
                drained = True
            except TimeoutError:
                log.warning("%s: queue not drained in %.0fs", self.name, drain_timeout)
        if not drained:
            queue.shutdown()
            for t in self._tasks:
                t.cancel()

    async def _worker(self, queue: WorkQueue[Request]) -> None:
        while True:
            try:
                req = await queue.get()
            except ShutDown:
                return
            await self._process(queue, req)

    async def _process(self, queue: WorkQueue[Request], req: Request) -> None:
        started = self._clock.now()
        outcome = "success"
        try:
            result = await self.reconcile(req)
        except asyncio.CancelledError:
            queue.done(req)
            raise
        except Exception:
            outcome = "error"
            log.exception("%s: reconcile %s failed", self.name, req)
            queue.add_rate_limited(req)
        else:
            if result is not None and result.requeue_after is not None:
                outcome = "requeue_after"
                queue.forget(req)
                queue.add_after(req, result.requeue_after)
            elif result is not None and result.requeue:
                outcome = "requeue"
                queue.add_rate_limited(req)
            else:
                queue.forget(req)
        queue.done(req)
        if self.metrics is not None:
            self.metrics.reconcile_time.labels(self.name).observe(self._clock.now() - started)
            self.metrics.reconcile_total.labels(self.name, outcome).inc()
            if outcome == "error":
                self.metrics.reconcile_errors.labels(self.name).inc()
