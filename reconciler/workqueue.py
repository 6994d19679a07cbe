"""A work queue with client-go's semantics, for asyncio.

- An item is queued once however often it is added (the dirty set), and is never handed to two
  workers at once (the processing set): an item added while it is processed is queued again when
  its worker calls `done`.
- `add_after` delays an item; a later, earlier deadline for the same item wins.
- `add_rate_limited` delays by the rate limiter (per-item exponential backoff combined with an
  overall token bucket by default); `forget` resets an item's backoff once it succeeded.
- `shutdown()` stops accepting items; queued items are still handed out, then `get` raises
  `ShutDown`. `shutdown_with_drain()` also waits until every handed-out item is done.

The state machine is synchronous (`add`, `try_get`, `done`), with the clock injected, so tests
drive it deterministically; `get()` is the awaitable form workers use.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from .clock import REAL_CLOCK, Clock, Timer
from .ratelimit import RateLimiter, default_controller_rate_limiter

T = TypeVar("T", bound=Hashable)


class ShutDown(Exception):
    """The queue is shut down and empty."""


class QueueEmpty(Exception):
    """`try_get` found nothing to hand out."""


class WorkQueue(Generic[T]):
    def __init__(
        self,
        name: str = "",
        *,
        clock: Clock = REAL_CLOCK,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.name = name
        self._clock = clock
        self.rate_limiter: RateLimiter = rate_limiter or default_controller_rate_limiter(clock)
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._waiting: dict[T, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()
        self._timer: Timer | None = None
        self._timer_at: float | None = None
        self._getters: deque[asyncio.Future[None]] = deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._shutting_down = False
        self._queued_at: dict[T, float] = {}
        # For metrics: counters, and an optional observer of the time items wait to be taken.
        self.adds = 0
        self.retries = 0
        self.observe_wait: Callable[[float], None] | None = None

    # --- the basic queue ---
    def add(self, item: T) -> None:
        if self._shutting_down or item in self._dirty:
            return
        self.adds += 1
        self._dirty.add(item)
        if item in self._processing:
            return  # queued again by done()
        self._enqueue(item)

    def _enqueue(self, item: T) -> None:
        self._queue.append(item)
        self._queued_at[item] = self._clock.now()
        self._wake_one()

    def try_get(self) -> T:
        """Hand out the next item (the caller must call `done`), or raise QueueEmpty/ShutDown."""
        if self._queue:
            item = self._queue.popleft()
            self._processing.add(item)
            self._dirty.discard(item)
            queued_at = self._queued_at.pop(item, None)
            if self.observe_wait is not None and queued_at is not None:
                self.observe_wait(self._clock.now() - queued_at)
            return item
        if self._shutting_down:
            raise ShutDown(self.name)
        raise QueueEmpty(self.name)

    async def get(self) -> T:
        while True:
            try:
                return self.try_get()
            except QueueEmpty:
                pass
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._wake_one()  # we were woken for an item: pass the wake-up on
                raise
            finally:
                if fut in self._getters:
                    self._getters.remove(fut)

    def done(self, item: T) -> None:
        self._processing.discard(item)
        if item in self._dirty:
            self._enqueue(item)
        self._check_idle()

    def __len__(self) -> int:
        """Items queued and not yet handed out (client-go's Len)."""
        return len(self._queue)

    @property
    def processing(self) -> int:
        return len(self._processing)

    @property
    def waiting(self) -> int:
        """Items delayed by add_after / add_rate_limited."""
        return len(self._waiting)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def shutdown(self) -> None:
        """Accept no more items and drop delayed ones; queued items are still handed out."""
        self._shutting_down = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        self._waiting.clear()
        self._heap.clear()
        for fut in self._getters:
            if not fut.done():
                fut.set_result(None)
        self._check_idle()

    async def shutdown_with_drain(self) -> None:
        """Shut down, then wait until every queued and handed-out item is done (workers must keep
        calling `get` and `done`; bound the wait with `asyncio.timeout`)."""
        self.shutdown()
        if self._idle():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._idle_waiters:
                self._idle_waiters.remove(fut)

    def _idle(self) -> bool:
        return not self._queue and not self._processing

    def _check_idle(self) -> None:
        if self._shutting_down and self._idle():
            for fut in self._idle_waiters:
                if not fut.done():
                    fut.set_result(None)

    def _wake_one(self) -> None:
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    # --- delays ---
    def add_after(self, item: T, delay: float) -> None:
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(item)
            return
        ready = self._clock.now() + delay
        current = self._waiting.get(item)
        if current is not None and current[0] <= ready:
            return  # already due sooner
        seq = next(self._seq)
        self._waiting[item] = (ready, seq)
        heapq.heappush(self._heap, (ready, seq, item))
        self._arm()

    def _arm(self) -> None:
        # Drop entries superseded by an earlier deadline for the same item.
        while self._heap and self._waiting.get(self._heap[0][2]) != self._heap[0][:2]:
            heapq.heappop(self._heap)
        if not self._heap:
            return
        when = self._heap[0][0]
        if self._timer is not None and self._timer_at is not None and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._clock.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = self._timer_at = None
        now = self._clock.now()
        while self._heap and self._heap[0][0] <= now:
            ready, seq, item = heapq.heappop(self._heap)
            if self._waiting.get(item) == (ready, seq):
                del self._waiting[item]
                self.add(item)
        self._arm()

    # --- rate limiting ---
    def add_rate_limited(self, item: T) -> None:
        if self._shutting_down:
            return
        self.retries += 1
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: T) -> None:
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return self.rate_limiter.num_requeues(item)
