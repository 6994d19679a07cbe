"""Token buckets, exponential failure limiter and jittered backoff, with deterministic time."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.clock import FakeClock
from reconciler.ratelimit import Backoff, ItemExponentialFailureRateLimiter, TokenBucket


@given(
    rate=st.floats(0.1, 100),
    burst=st.integers(1, 50),
    steps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_bucket_never_grants_more_than_burst_plus_refill(
    rate: float, burst: int, steps: list[float]
) -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate, burst, clock)
    granted = 0
    for dt in steps:
        clock.step(dt)
        while bucket.try_take():
            granted += 1
        assert granted <= burst + rate * clock.now() + 1e-6
    # and it grants everything it may: at most one token short of the bound
    assert granted >= burst + rate * clock.now() - burst - 1 or granted >= burst


@given(rate=st.floats(0.5, 50), burst=st.integers(1, 20), n=st.integers(1, 100))
def test_reserve_spaces_callers_one_token_apart(rate: float, burst: int, n: int) -> None:
    bucket = TokenBucket(rate, burst, FakeClock())
    delays = [bucket.reserve() for _ in range(n)]
    assert delays[: min(n, burst)] == [0.0] * min(n, burst)
    for i in range(burst, n):
        assert delays[i] == pytest.approx((i - burst + 1) / rate)


def test_bucket_refills_to_burst_only() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2.0, 3, clock)
    assert [bucket.try_take() for _ in range(4)] == [True, True, True, False]
    clock.step(0.5)
    assert bucket.try_take() and not bucket.try_take()
    clock.step(3600)
    assert bucket.tokens == pytest.approx(3.0)


@given(failures=st.integers(0, 200))
def test_exponential_limiter_is_capped(failures: int) -> None:
    lim = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    delays = [lim.when("x") for _ in range(failures + 1)]
    assert delays[-1] == min(0.005 * 2**failures, 1000.0)
    assert all(b >= a for a, b in itertools.pairwise(delays)), "never shrinks"
    assert lim.num_requeues("x") == failures + 1
    assert lim.num_requeues("y") == 0


def test_backoff_doubles_to_cap_with_jitter_and_resets_after_quiet_period() -> None:
    clock = FakeClock()
    b = Backoff(clock=clock, rng=random.Random(1))
    bases = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    for base in bases:
        d = b.next()
        assert base <= d < base * 1.2
        clock.step(1)
    clock.step(121)
    assert 0.8 <= b.next() < 0.96, "back to the start after 2 min without failures"


def test_backoff_jitter_spreads_clients() -> None:
    delays = {round(Backoff(rng=random.Random(seed)).next(), 6) for seed in range(20)}
    assert len(delays) > 15
