"""Reviews the API server answers (TokenReview, SubjectAccessReview), cached, joined and within a
budget of their own: the one engine behind /metrics' authorization (metrics_auth.py) and the
progress push endpoint's (progress_controller/push_auth.py).

Anyone who reaches a port that checks bearer tokens can send a new token with every request, and
each costs the API server a review. So:

- at most `rate` new reviews per second (burst `burst`) and `max_in_flight` at once; beyond that
  the caller's `over_budget` answer at once (their 429), never a queue;
- answers cached by a key the caller makes (a hash of the token, never the token), good ones and
  refusals apart (each bounded, least recently used out), so that a flood of bad tokens cannot
  push out a good one; for how long is the caller's verdict (`Verdict.ttl`);
- concurrent requests with the same key share one review;
- a review that fails (the API server unreachable, slow past `review_timeout`) is the caller's
  `unavailable` answer (their 503) and is not cached: the next request asks again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .clock import REAL_CLOCK, Clock
from .errors import KubeError
from .ratelimit import TokenBucket

K = TypeVar("K")
V = TypeVar("V")
Key = TypeVar("Key", bound=Hashable)
A = TypeVar("A")


class ExpiringCache(Generic[K, V]):
    """Answers by key until they expire; at most `size`, the least recently used out first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K, now: float) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return hit[1]

    def put(self, key: K, answer: V, until: float) -> None:
        self._items[key] = (until, answer)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class Verdict(Generic[A]):
    """What a review found: the answer, whether it lets the request through (which cache it goes
    to), and for how many seconds it may be reused (<= 0: not at all)."""

    answer: A
    good: bool
    ttl: float


class ReviewBudget(Generic[Key, A]):
    """Answers by key: from the cache, from a review of the same key in flight, or from a new
    review (`review`, the caller's request to the API server) when the budget allows."""

    def __init__(
        self,
        *,
        over_budget: A,
        unavailable: Callable[[BaseException], A],
        max_entries: int,
        rate: float,
        burst: int,
        max_in_flight: int,
        review_timeout: float,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.over_budget = over_budget
        self.unavailable = unavailable
        self.max_in_flight = max_in_flight
        self.review_timeout = review_timeout
        self.clock = clock
        self.good: ExpiringCache[Key, A] = ExpiringCache(max_entries)
        self.refused: ExpiringCache[Key, A] = ExpiringCache(max_entries)
        self._budget = TokenBucket(rate, burst, clock)
        self._pending: dict[Key, asyncio.Task[A]] = {}
        # reviews: sent; cached: answered from a cache; joined: waited on a review in flight;
        # over_budget: refused for want of budget.
        self.stats = {"reviews": 0, "cached": 0, "joined": 0, "over_budget": 0}

    async def answer(self, key: Key, review: Callable[[], Awaitable[Verdict[A]]]) -> A:
        now = self.clock.now()
        for cache in (self.good, self.refused):
            if (hit := cache.get(key, now)) is not None:
                self.stats["cached"] += 1
                return hit
        task = self._pending.get(key)
        if task is not None:
            self.stats["joined"] += 1
        else:
            if len(self._pending) >= self.max_in_flight or not self._budget.try_take():
                self.stats["over_budget"] += 1
                return self.over_budget
            task = asyncio.create_task(self._resolve(key, review))
            self._pending[key] = task
        # Shielded: a caller that goes away does not cancel the review others wait on.
        return await asyncio.shield(task)

    async def _resolve(self, key: Key, review: Callable[[], Awaitable[Verdict[A]]]) -> A:
        try:
            async with asyncio.timeout(self.review_timeout):
                self.stats["reviews"] += 1
                verdict = await review()
        except (KubeError, OSError, TimeoutError) as e:  # not cached: the next request asks again
            return self.unavailable(e)
        finally:
            self._pending.pop(key, None)
        if verdict.ttl > 0:
            cache = self.good if verdict.good else self.refused
            cache.put(key, verdict.answer, self.clock.now() + verdict.ttl)
        return verdict.answer

    def cancel(self) -> None:
        """Cancel the reviews in flight (on shutdown)."""
        for task in list(self._pending.values()):
            task.cancel()
