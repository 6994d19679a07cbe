"""List-then-watch informers with a local cache (client-go's reflector + informer, in asyncio).

- LIST (paginated, consistent) then WATCH from the list's resourceVersion, with bookmarks so the
  resourceVersion stays fresh while nothing changes; a watch that ends is resumed from the last
  resourceVersion seen, with a randomised `timeoutSeconds` (5-10 min) so many informers do not
  reconnect together.
- A 410 Gone (the resourceVersion was compacted away) means events were missed: relist, and
  deliver the differences between the cache and the new list as synthetic adds, updates and
  deletes, so handlers converge on the server's state with nothing missed.
- Failures back off with jitter (0.8 s doubling to 30 s).
- `transform` (client-go's SetTransform, reconciler/transform.py) is applied to every object
  before it enters the cache or reaches a handler, LIST pages as they arrive: the cache holds
  only the fields the controller reads.

Handlers run inline in the informer's task and must not block: they should only enqueue keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .cache import IndexFunc, Store
from .clock import REAL_CLOCK, Clock
from .errors import ApiError, Gone, TransportError
from .objects import KubeObject, object_key, resource_version
from .ratelimit import Backoff
from .resources import ResourceClient, WatchEvent
from .transform import Transform

log = logging.getLogger(__name__)


@dataclass
class EventHandler:
    on_add: Callable[[KubeObject], None] | None = None
    on_update: Callable[[KubeObject, KubeObject], None] | None = None
    on_delete: Callable[[KubeObject], None] | None = None


class _Adder(Protocol):
    def add(self, item: str) -> None: ...


def enqueue_keys(queue: _Adder) -> EventHandler:
    """A handler that adds the object's "namespace/name" key to a work queue on every event."""

    def add(obj: KubeObject) -> None:
        queue.add(object_key(obj))

    return EventHandler(on_add=add, on_update=lambda _old, new: add(new), on_delete=add)


@dataclass
class InformerStats:
    lists: int = 0  # LISTs completed, the first and relists
    relists: int = 0  # LISTs after the first one (each follows a 410 Gone)
    gone: int = 0  # 410 Gone answers to a watch
    watches: int = 0  # watch requests made
    watch_restarts: int = 0  # watches made again after one ended or failed
    watch_errors: int = 0  # watches or lists that failed other than with 410
    list_restarts: int = 0  # paginated LISTs restarted because a continue token expired
    events: Counter[str] = field(default_factory=Counter)  # watch events by type
    synthetic: Counter[str] = field(default_factory=Counter)  # relist differences by kind


class Informer:
    def __init__(
        self,
        api: ResourceClient,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexers: dict[str, IndexFunc] | None = None,
        page_size: int | None = 500,
        watch_timeout: tuple[int, int] = (300, 600),
        backoff: Backoff | None = None,
        clock: Clock = REAL_CLOCK,
        rng: random.Random | None = None,
        name: str | None = None,
        transform: Transform | None = None,
    ) -> None:
        self.api = api
        self.transform = transform
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.store = Store(indexers)
        self.stats = InformerStats()
        self.name = name or api.resource.plural + (f"/{namespace}" if namespace else "")
        self._handlers: list[EventHandler] = []
        self._clock = clock
        self._rng = rng or random.Random()
        self._backoff = backoff or Backoff(clock=clock, rng=self._rng)
        self._rv = ""
        self._synced = asyncio.Event()
        self._listed_once = False
        self._watched_once = False

    # --- public ---
    @property
    def has_synced(self) -> bool:
        """True once the first LIST has been delivered to the handlers."""
        return self._synced.is_set()

    @property
    def last_resource_version(self) -> str:
        return self._rv

    async def wait_for_sync(self) -> None:
        await self._synced.wait()

    def add_handler(self, handler: EventHandler) -> None:
        """Register a handler; one added after sync first gets an add for every cached object."""
        self._handlers.append(handler)
        if self.has_synced and handler.on_add is not None:
            for obj in self.store:
                self._call(handler.on_add, obj)

    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        self.store.add_indexers(indexers)

    async def run(self) -> None:
        """Run until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch()
            except Gone as e:
                self.stats.gone += 1
                log.info("%s: watch from %s expired (%s): relisting", self.name, self._rv, e)
                need_list = True
            except (ApiError, TransportError, ValueError) as e:
                # ValueError: a malformed watch record (JSON), seen as a broken stream.
                self.stats.watch_errors += 1
                delay = self._backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self.name, e, delay)
                await self._clock.sleep(delay)

    # --- list ---
    async def _list(self) -> None:
        result = await self.api.list_all(
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            page_size=self.page_size,
            transform=self.transform,
        )
        self.stats.lists += 1
        if self._listed_once:
            self.stats.relists += 1
        self.stats.list_restarts += result.restarts
        self._replace(result.items, synthetic=self._listed_once)
        self._listed_once = True
        self._rv = result.resource_version
        self._synced.set()

    def _replace(self, items: list[KubeObject], *, synthetic: bool) -> None:
        """Make the cache equal `items`, delivering each difference to the handlers."""
        seen: set[str] = set()
        for obj in items:
            key, old = self.store.put(obj)
            seen.add(key)
            if old is None:
                if synthetic:
                    self.stats.synthetic["add"] += 1
                self._dispatch_add(obj)
            elif resource_version(old) != resource_version(obj):
                self.stats.synthetic["update"] += 1
                self._dispatch_update(old, obj)
        for key in [k for k in self.store.keys() if k not in seen]:
            gone = self.store.delete(key)
            if gone is not None:
                self.stats.synthetic["delete"] += 1
                self._dispatch_delete(gone)

    # --- watch ---
    async def _watch(self) -> None:
        if self._watched_once:
            self.stats.watch_restarts += 1
        self._watched_once = True
        self.stats.watches += 1
        lo, hi = self.watch_timeout
        started = self._clock.now()
        received = 0
        events = self.api.watch(
            self.namespace,
            resource_version=self._rv,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=self._rng.randint(lo, hi),
        )
        async with contextlib.aclosing(events):
            async for event in events:
                received += 1
                self._apply(event)
        if received == 0 and self._clock.now() - started < 1.0:
            # client-go's "very short watch": the server closes at once; back off, do not spin.
            raise TransportError("the watch closed within a second without any event")

    def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        self.stats.events[event.type] += 1
        if self.transform is not None and event.type in ("ADDED", "MODIFIED", "DELETED"):
            obj = self.transform(obj)
        if event.type in ("ADDED", "MODIFIED"):
            _, old = self.store.put(obj)
            if old is None:
                self._dispatch_add(obj)
            else:
                self._dispatch_update(old, obj)
        elif event.type == "DELETED":
            self.store.delete(object_key(obj))
            self._dispatch_delete(obj)
        elif event.type != "BOOKMARK":
            log.warning("%s: unknown watch event type %r", self.name, event.type)
            return
        rv = resource_version(obj)
        if rv:
            self._rv = rv

    # --- handlers ---
    def _call(self, fn: Callable[..., None], *args: KubeObject) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: event handler failed", self.name)

    def _dispatch_add(self, obj: KubeObject) -> None:
        for h in self._handlers:
            if h.on_add is not None:
                self._call(h.on_add, obj)

    def _dispatch_update(self, old: KubeObject, new: KubeObject) -> None:
        for h in self._handlers:
            if h.on_update is not None:
                self._call(h.on_update, old, new)

    def _dispatch_delete(self, obj: KubeObject) -> None:
        for h in self._handlers:
            if h.on_delete is not None:
                self._call(h.on_delete, obj)
