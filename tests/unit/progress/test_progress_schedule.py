"""Polling intervals, stall windows and the exec limiter."""

from __future__ import annotations

import asyncio
import random

from progress_controller.schedule import (
    ExecLimiter,
    PollSettings,
    poll_interval,
    stall_after,
    update_period,
)

S = PollSettings(jitter=0.0)


def test_intervals_early_recent_stale() -> None:
    kw = {"period": None}
    assert poll_interval(S, has_record=False, age=1000, since_change=None, **kw) == 15
    assert poll_interval(S, has_record=True, age=10, since_change=5, **kw) == 15
    assert poll_interval(S, has_record=True, age=1000, since_change=5, **kw) == 30
    assert poll_interval(S, has_record=True, age=1000, since_change=1000, **kw) == 60
    assert poll_interval(S, has_record=True, age=1000, since_change=None, **kw) == 60


def test_never_faster_than_the_file_is_written() -> None:
    period = update_period(20.0, 5)
    assert period == 100
    assert poll_interval(S, has_record=True, age=10, since_change=1, period=period) == 100
    assert update_period(None, 5) is None and update_period(0.0, 5) is None


def test_jitter_is_upward_and_bounded() -> None:
    s = PollSettings(jitter=0.1)
    rnd = random.Random(1)
    vals = [
        poll_interval(s, has_record=True, age=1000, since_change=5, period=None, rand=rnd)
        for _ in range(200)
    ]
    assert all(30 <= v <= 33 for v in vals) and len(set(vals)) > 100


def test_stall_window() -> None:
    assert stall_after(S, None) == 60
    assert stall_after(S, 100.0) == 300
    assert stall_after(S.scaled(0.1), None) == 6


async def test_limiter_bounds_concurrency() -> None:
    lim = ExecLimiter(concurrency=3, rate=1000, burst=1000, per_namespace=20)

    async def one() -> None:
        async with lim.slot("ns"):
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one() for _ in range(20)))
    assert lim.max_in_flight == 3 and lim.total == 20 and lim.in_flight == 0


def test_exec_limiter_shares_by_namespace() -> None:
    assert ExecLimiter(concurrency=10).per_namespace == 5  # half the slots by default
    assert ExecLimiter(concurrency=1).per_namespace == 1
    assert ExecLimiter(concurrency=10, per_namespace=3).per_namespace == 3
    lim = ExecLimiter()
    retries = [lim.retry_after(random.Random(i)) for i in range(100)]
    assert all(1.0 <= r < 2.0 for r in retries) and len(set(retries)) > 90


def test_push_fresh_until() -> None:
    from progress_controller.schedule import MAX_PUSH_INTERVAL, push_fresh_until

    assert push_fresh_until(None, None, 15.0) == float("-inf")  # never pushed: polled as before
    assert push_fresh_until(100.0, None, 15.0) == 130.0  # first push: twice the default
    assert push_fresh_until(100.0, 10.0, 15.0) == 120.0  # twice the measured interval
    assert push_fresh_until(100.0, 0.001, 15.0) == 102.0  # at least 1 s
    assert push_fresh_until(100.0, 1e9, 15.0) == 100.0 + 2 * MAX_PUSH_INTERVAL
