"""Rate limiters and backoff: client-go's token bucket, per-item exponential failure limiter, and
their maximum (the default controller limiter), plus the jittered backoff informers use.

All take a `Clock`, so tests drive them with `FakeClock` and never sleep.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from typing import Protocol

from .clock import REAL_CLOCK, Clock


class TokenBucket:
    """`rate` tokens per second up to `burst`. `reserve()` may go into debt, like Go's
    `rate.Limiter.Reserve()`: each caller gets the delay after which its token exists, so
    concurrent callers are spaced out rather than all waking at once."""

    def __init__(self, rate: float, burst: int, clock: Clock = REAL_CLOCK) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock.now()

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now

    def reserve(self) -> float:
        """Take a token, returning how long the caller must wait before using it."""
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def try_take(self) -> bool:
        """Take a token if one is available now; never goes into debt."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def delay(self) -> float:
        """Seconds until a token is available (0 when one is); takes nothing."""
        self._refill()
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate

    def set_rate(self, rate: float) -> None:
        """Change the rate from now on: tokens earned so far are kept (at the old rate)."""
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self._refill()
        self.rate = rate

    async def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await self._clock.sleep(delay)

    @property
    def tokens(self) -> float:
        self._refill()
        return self._tokens


class AimdRate:
    """A client rate the API server can lower: `ceiling` until the server answers 429 (API
    priority-and-fairness rejecting, with its Retry-After), then halved (down to `floor`), then
    recovering by `increase` requests/s every second back to `ceiling` (additive increase,
    multiplicative decrease, as TCP does with its window).

    Why: a fixed low QPS (client-go's 20) starves a big fleet even when the server has seats to
    spare, and a fixed high one keeps pressing a server that is shedding load. With this the
    configured QPS is what we may use; how much of it we do use follows the server's answers.

    The 429s that answer requests sent at the old rate arrive together; only one decrease is made
    per `hold` seconds (at least the Retry-After), so one burst of rejections halves once.
    Pure: a clock, no I/O (tests drive it with FakeClock).
    """

    def __init__(
        self,
        ceiling: float,
        *,
        floor: float = 1.0,
        decrease: float = 0.5,
        increase: float = 1.0,
        hold: float = 1.0,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        if not 0 < floor <= ceiling:
            raise ValueError("need 0 < floor <= ceiling")
        if not 0 < decrease < 1 or increase <= 0 or hold < 0:
            raise ValueError("need 0 < decrease < 1, increase > 0, hold >= 0")
        self.ceiling = ceiling
        self.floor = floor
        self.decrease = decrease
        self.increase = increase
        self.hold = hold
        self._clock = clock
        self._low = ceiling  # the rate right after the last decrease
        self._since = clock.now()  # when it was made
        self._hold_until = float("-inf")
        self.decreases = 0

    def rate(self) -> float:
        """The rate in force now: the last decrease plus what has been recovered since."""
        grown = self._low + self.increase * max(0.0, self._clock.now() - self._since)
        return min(self.ceiling, grown)

    def throttled(self, retry_after: float | None = None) -> float:
        """The server refused a request for load: lower the rate (once per hold) and return it."""
        now = self._clock.now()
        if now < self._hold_until:
            return self.rate()
        self._low = max(self.floor, self.rate() * self.decrease)
        self._since = now + (retry_after or 0.0)  # no recovery before the server's own wait
        self._hold_until = now + max(self.hold, retry_after or 0.0)
        self.decreases += 1
        return self._low


class RateLimiter(Protocol):
    """client-go's workqueue.RateLimiter: how long to wait before an item is retried."""

    def when(self, item: Hashable) -> float: ...

    def forget(self, item: Hashable) -> None: ...

    def num_requeues(self, item: Hashable) -> int: ...


class ItemExponentialFailureRateLimiter:
    """base * 2**failures per item, capped at `max_delay` (defaults 5 ms and 1000 s)."""

    def __init__(self, base: float = 0.005, max_delay: float = 1000.0) -> None:
        self.base = base
        self.max_delay = max_delay
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        exp = self._failures.get(item, 0)
        self._failures[item] = exp + 1
        if exp >= 64:  # 2**64 * base overflows any sane cap; skip the float arithmetic
            return self.max_delay
        return min(self.base * (2**exp), self.max_delay)

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """An overall token bucket shared by all items (defaults 10/s, burst 100)."""

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock = REAL_CLOCK) -> None:
        self.bucket = TokenBucket(qps, burst, clock)

    def when(self, item: Hashable) -> float:
        return self.bucket.reserve()

    def forget(self, item: Hashable) -> None:
        pass

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """The longest delay of several limiters; every limiter sees every call."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("at least one limiter")
        self.limiters = limiters

    def when(self, item: Hashable) -> float:
        return max([lim.when(item) for lim in self.limiters])

    def forget(self, item: Hashable) -> None:
        for lim in self.limiters:
            lim.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(lim.num_requeues(item) for lim in self.limiters)


def default_controller_rate_limiter(clock: Clock = REAL_CLOCK) -> MaxOfRateLimiter:
    """client-go's DefaultControllerRateLimiter: 5 ms..1000 s per item, overall 10/s burst 100."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0), BucketRateLimiter(10.0, 100, clock)
    )


class Backoff:
    """Exponential backoff with jitter for reconnect loops (client-go's reflector: 0.8 s doubling
    to 30 s, back to the start after 2 min without failures).

    Each delay is the current step times a random factor in [1, 1 + jitter), so clients that failed
    together do not retry together.
    """

    def __init__(
        self,
        initial: float = 0.8,
        maximum: float = 30.0,
        factor: float = 2.0,
        jitter: float = 0.2,
        reset_after: float = 120.0,
        clock: Clock = REAL_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.reset_after = reset_after
        self._clock = clock
        self._rng = rng or random.Random()
        self._step = initial
        self._last: float | None = None

    def next(self) -> float:
        now = self._clock.now()
        if self._last is not None and now - self._last > self.reset_after:
            self._step = self.initial
        self._last = now
        base = self._step
        self._step = min(self._step * self.factor, self.maximum)
        return base * (1.0 + self.jitter * self._rng.random())

    def reset(self) -> None:
        self._step = self.initial
        self._last = None
