"""An Event recorder (core/v1 Events) that never blocks its caller.

- `event(obj, type, reason, message)` only puts the event on a bounded queue; when the queue is
  full the event is dropped and counted (`stats["dropped_full"]`). A background task (`run()`,
  started by the manager) writes them.
- Aggregation (client-go's EventCorrelator logger): a repeat of the same type/reason/message on the
  same object PATCHes the existing Event's `count` and `lastTimestamp` instead of creating one.
- Rate limiting per object (client-go's spam filter): a token bucket per involved object, burst
  25, refilled one token per 5 minutes; events over it are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .clock import REAL_CLOCK, Clock
from .errors import NotFound
from .objects import KubeObject, meta, rfc3339
from .ratelimit import TokenBucket
from .resources import EVENTS

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024  # the API server's limit on an Event's message


@dataclass
class _Pending:
    involved: dict[str, str]
    type: str
    reason: str
    message: str
    action: str


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int


def object_reference(obj: KubeObject) -> dict[str, str]:
    m = meta(obj)
    ref = {
        "apiVersion": str(obj.get("apiVersion", "")),
        "kind": str(obj.get("kind", "")),
        "name": str(m.get("name", "")),
        "namespace": str(m.get("namespace") or ""),
        "uid": str(m.get("uid", "")),
        "resourceVersion": str(m.get("resourceVersion", "")),
    }
    return {k: v for k, v in ref.items() if v}


class EventRecorder:
    def __init__(
        self,
        client: Client,
        component: str,
        *,
        host: str | None = None,
        queue_size: int = 1000,
        burst: int = 25,
        refill_seconds: float = 300.0,
        cache_size: int = 4096,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.client = client
        self.api = client.api(EVENTS)
        self.component = component
        self.host = host or socket.gethostname()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=queue_size)
        self._burst = burst
        self._refill = 1.0 / refill_seconds
        self._clock = clock
        self._buckets: OrderedDict[tuple[str, ...], TokenBucket] = OrderedDict()
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._cache_size = cache_size
        # sent, aggregated, dropped_full, dropped_spam, failed
        self.stats: Counter[str] = Counter()

    def event(
        self, obj: KubeObject, type: str, reason: str, message: str, *, action: str = ""
    ) -> bool:
        """Record an event about `obj` (type "Normal" or "Warning"). Never blocks or raises for
        API trouble; returns False if the event was dropped."""
        involved = object_reference(obj)
        if not self._allow(involved):
            self.stats["dropped_spam"] += 1
            return False
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        try:
            self._queue.put_nowait(_Pending(involved, type, reason, message, action))
        except asyncio.QueueFull:
            self.stats["dropped_full"] += 1
            return False
        return True

    def _allow(self, involved: dict[str, str]) -> bool:
        key = (
            self.component,
            self.host,
            involved.get("kind", ""),
            involved.get("namespace", ""),
            involved.get("name", ""),
            involved.get("uid", ""),
            involved.get("apiVersion", ""),
        )
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self._refill, self._burst, self._clock)
            self._buckets[key] = bucket
            if len(self._buckets) > self._cache_size:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.try_take()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    async def run(self) -> None:
        """Write queued events until cancelled."""
        while True:
            ev = await self._queue.get()
            try:
                await self._write(ev)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let one event stop the recorder
                self.stats["failed"] += 1
                log.warning("event %s on %s: %s", ev.reason, ev.involved.get("name"), e)
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        """Wait until every queued event has been written (or given up on)."""
        await self._queue.join()

    async def _write(self, ev: _Pending) -> None:
        inv = ev.involved
        key = (
            inv.get("kind", ""),
            inv.get("namespace", ""),
            inv.get("name", ""),
            inv.get("uid", ""),
            inv.get("apiVersion", ""),
            ev.type,
            ev.reason,
            ev.message,
        )
        now = rfc3339()
        seen = self._seen.get(key)
        if seen is not None:
            self._seen.move_to_end(key)
            patch = {"count": seen.count + 1, "lastTimestamp": now, "message": ev.message}
            with contextlib.suppress(NotFound):  # expired (1 h TTL) or deleted: create anew
                await self.api.patch(seen.name, patch, seen.namespace, patch_type="merge")
                seen.count += 1
                self.stats["aggregated"] += 1
                return
        namespace = inv.get("namespace") or "default"
        body: KubeObject = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{inv.get('name', 'object')}.{time.time_ns():x}",
                "namespace": namespace,
            },
            "involvedObject": inv,
            "type": ev.type,
            "reason": ev.reason,
            "message": ev.message,
            "source": {"component": self.component, "host": self.host},
            "reportingComponent": self.component,
            "reportingInstance": self.host,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if ev.action:
            body["action"] = ev.action
        created = await self.api.create(body, namespace)
        self.stats["sent"] += 1
        self._seen[key] = _Seen(created["metadata"]["name"], namespace, 1)
        if len(self._seen) > self._cache_size:
            self._seen.popitem(last=False)
