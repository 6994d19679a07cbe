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
    lim = ExecLimiter(concurrency=3, rate=1000, burst=1000)

    async def one() -> None:
        async with lim.slot():
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one() for _ in range(20)))
    assert lim.max_in_flight == 3 and lim.total == 20 and lim.in_flight == 0
