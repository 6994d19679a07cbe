"""Fair sharing of a bounded resource (e.g. exec slots) between keys (e.g. namespaces).

Three bounds: at most `concurrency` holders in all, at most `rate` acquisitions per second (burst
`burst`) in all, and at most `per_key` holders plus waiters for any one key.

Why not one semaphore and one token bucket: a slot is held for the whole operation, so a key
whose operations are slow (a pod whose `cat` hangs until the timeout) takes every slot it can
queue for, and every other key waits behind it. Here:

- a key at its bound is refused at once (`Busy`) rather than queued: its callers do not wait
  behind its own slow work (nor hold the caller's workers while they wait), and one key can never
  hold more than `per_key` slots, so with `per_key < concurrency` the others always find some;
- whenever a slot and a token are free, the next one goes to the waiting key with the fewest
  holders, ties to the key that has waited longest (max-min fairness, round-robin among equals),
  so the rate alternates between the keys that want it rather than following arrival order.

`FairShare` is the decision alone (a clock, no tasks: tested with `FakeClock`); `FairLimiter`
is its asyncio shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .clock import REAL_CLOCK, Clock, Timer
from .ratelimit import TokenBucket


class Busy(Exception):
    """The key already has its `per_key` holders and waiters: come back later."""

    def __init__(self, key: str, per_key: int) -> None:
        super().__init__(f"{key!r} has {per_key} in flight or waiting (its share)")
        self.key = key


@dataclass(eq=False)
class Ticket:
    """One caller's place: waiting until `granted`, then holding until released."""

    key: str
    seq: int
    granted: bool = False
    done: bool = False


class FairShare:
    """Which waiting caller gets the next slot, and when (see the module docstring)."""

    def __init__(
        self,
        concurrency: int,
        per_key: int,
        rate: float,
        burst: int,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        if concurrency < 1 or per_key < 1:
            raise ValueError("concurrency and per_key must be at least 1")
        self.concurrency = concurrency
        self.per_key = per_key
        self._bucket = TokenBucket(rate, burst, clock)
        # Keys with waiters, in the order they began waiting (or were last served): dict order.
        self._waiting: dict[str, deque[Ticket]] = {}
        self._holders: Counter[str] = Counter()
        self._seq = itertools.count()
        self.in_flight = 0
        self.max_in_flight = 0
        self.total = 0  # slots granted
        self.refused = 0  # Busy answers

    def holders(self, key: str) -> int:
        return self._holders[key]

    def waiting(self, key: str | None = None) -> int:
        if key is not None:
            return len(self._waiting.get(key, ()))
        return sum(len(q) for q in self._waiting.values())

    def enter(self, key: str) -> Ticket:
        """Queue a caller for `key`, or raise Busy if the key is at its bound."""
        if self._holders[key] + len(self._waiting.get(key, ())) >= self.per_key:
            self.refused += 1
            raise Busy(key, self.per_key)
        ticket = Ticket(key, next(self._seq))
        self._waiting.setdefault(key, deque()).append(ticket)
        return ticket

    def grant(self) -> list[Ticket]:
        """Grant as many waiters as the free slots and tokens allow, fairest first."""
        out: list[Ticket] = []
        while self._waiting and self.in_flight < self.concurrency:
            # min() keeps the first of equals: the key that has waited longest.
            key = min(self._waiting, key=self._holders.__getitem__)
            if not self._bucket.try_take():
                break
            queue = self._waiting.pop(key)
            ticket = queue.popleft()
            if queue:
                self._waiting[key] = queue  # to the back: round-robin among equals
            ticket.granted = True
            self._holders[key] += 1
            self.in_flight += 1
            self.total += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            out.append(ticket)
        return out

    def release(self, ticket: Ticket) -> None:
        """The holder is done (or a waiter gave up): its slot or place is free again."""
        if ticket.done:
            return
        ticket.done = True
        if ticket.granted:
            self._holders[ticket.key] -= 1
            if not self._holders[ticket.key]:
                del self._holders[ticket.key]
            self.in_flight -= 1
            return
        queue = self._waiting.get(ticket.key)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(ticket)
            if not queue:
                del self._waiting[ticket.key]

    def wait_time(self) -> float | None:
        """Seconds until a token lets the next waiter in, when only the rate holds it back."""
        if not self._waiting or self.in_flight >= self.concurrency:
            return None
        return self._bucket.delay()


class FairLimiter:
    """`async with limiter.slot(key):` under the bounds of a `FairShare`; raises `Busy` at once
    when the key is at its bound. Waiters are woken in `FairShare.grant`'s order."""

    def __init__(
        self,
        concurrency: int = 10,
        per_key: int = 5,
        rate: float = 20.0,
        burst: int = 20,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.share = FairShare(concurrency, per_key, rate, burst, clock)
        self._clock = clock
        self._futures: dict[Ticket, asyncio.Future[None]] = {}
        self._timer: Timer | None = None
        self._timer_at = float("inf")

    @property
    def in_flight(self) -> int:
        return self.share.in_flight

    @property
    def max_in_flight(self) -> int:
        return self.share.max_in_flight

    @property
    def total(self) -> int:
        return self.share.total

    @property
    def refused(self) -> int:
        return self.share.refused

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        ticket = self.share.enter(key)  # Busy goes to the caller
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures[ticket] = fut
        self._dispatch()
        try:
            await fut
        except BaseException:  # cancelled while waiting (or just after the grant)
            self._futures.pop(ticket, None)
            self.share.release(ticket)
            self._dispatch()
            raise
        try:
            yield
        finally:
            self.share.release(ticket)
            self._dispatch()

    def _dispatch(self) -> None:
        for ticket in self.share.grant():
            fut = self._futures.pop(ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        delay = self.share.wait_time()
        if delay is None:
            return
        when = self._clock.now() + max(delay, 0.0)
        if self._timer is not None and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._clock.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        self._dispatch()
