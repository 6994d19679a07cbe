"""The fair limiter with deterministic time (FakeClock): per-key bounds, who is served next, the
rate shared round-robin, cancellation, and the case it exists for: one key's slow holders do not
delay another key's callers, where one global semaphore made them wait for the slow ones."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from reconciler.clock import FakeClock
from reconciler.fairlimit import Busy, FairLimiter, FairShare, Ticket

FAST = 1e9  # a rate that never holds anyone back


def test_a_key_at_its_bound_is_refused_at_once() -> None:
    share = FairShare(concurrency=10, per_key=2, rate=FAST, burst=100, clock=FakeClock())
    a1, a2 = share.enter("a"), share.enter("a")
    with pytest.raises(Busy):
        share.enter("a")  # two waiting: refused, not queued
    assert share.grant() == [a1, a2]
    with pytest.raises(Busy):
        share.enter("a")  # two holding
    share.enter("b")  # another key is not affected
    share.release(a1)
    share.enter("a")  # a slot of its own is free again
    assert share.refused == 2


def test_the_next_slot_goes_to_the_key_with_the_fewest_holders() -> None:
    share = FairShare(concurrency=4, per_key=3, rate=FAST, burst=100, clock=FakeClock())
    held = [share.enter("a") for _ in range(3)]
    b1 = share.enter("b")
    # All four slots taken; b's first comes right after a's first (a then holds one, b none).
    assert share.grant() == [held[0], b1, held[1], held[2]]
    b2 = share.enter("b")  # b's second, waiting since before c's first
    c1 = share.enter("c")
    share.release(held[0])
    # c holds nothing, b one: c first though b waited longer.
    assert share.grant() == [c1]
    share.release(held[1])
    assert share.grant() == [b2]


def test_the_rate_alternates_between_waiting_keys() -> None:
    clock = FakeClock()
    share = FairShare(concurrency=100, per_key=3, rate=1.0, burst=1, clock=clock)
    for key in "aaabbb":
        share.enter(key)
    order: list[str] = []
    for _ in range(6):
        order += [t.key for t in share.grant()]
        assert share.wait_time() in (None, pytest.approx(1.0))
        clock.step(1.0)
    assert order == ["a", "b", "a", "b", "a", "b"]


def test_a_waiter_that_gives_up_leaves_no_trace() -> None:
    share = FairShare(concurrency=1, per_key=2, rate=FAST, burst=100, clock=FakeClock())
    first = share.enter("a")
    assert share.grant() == [first]
    waiter = share.enter("a")
    share.release(waiter)  # gave up while waiting
    share.release(waiter)  # twice is harmless
    assert share.waiting() == 0 and share.holders("a") == 1
    share.release(first)
    assert share.in_flight == 0 and share.grant() == []


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _run_for(clock: FakeClock, seconds: float, tick: float = 0.01) -> None:
    for _ in range(round(seconds / tick)):
        clock.step(tick)
        await _settle()


async def test_waiters_wake_in_order_and_the_rate_timer_fires() -> None:
    clock = FakeClock()
    lim = FairLimiter(concurrency=2, per_key=2, rate=1.0, burst=1, clock=clock)
    got: list[str] = []
    release = asyncio.Event()

    async def take(key: str) -> None:
        async with lim.slot(key):
            got.append(key)
            await release.wait()

    tasks = [asyncio.create_task(take(k)) for k in ("a", "a", "b")]
    await _settle()
    assert got == ["a"]  # a slot is free, but the next token is 1 s away
    clock.step(0.999)
    await _settle()
    assert got == ["a"]
    clock.step(0.001)
    await _settle()
    assert got == ["a", "b"]  # b (no holder) before a's second, which waited longer
    release.set()
    await _settle()
    clock.step(1.0)
    await _settle()
    assert got == ["a", "b", "a"]
    await asyncio.gather(*tasks)
    assert lim.in_flight == 0 and lim.total == 3


async def test_cancelled_waiters_and_holders_give_their_places_back() -> None:
    lim = FairLimiter(concurrency=1, per_key=5, rate=FAST, burst=100, clock=FakeClock())
    hold = asyncio.Event()

    async def take() -> None:
        async with lim.slot("a"):
            await hold.wait()

    holder = asyncio.create_task(take())
    waiter = asyncio.create_task(take())
    await _settle()
    waiter.cancel()
    holder.cancel()
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert lim.in_flight == 0 and lim.share.waiting() == 0
    async with lim.slot("a"):
        assert lim.in_flight == 1


async def _tenants(lim: FairLimiter, clock: FakeClock) -> list[float]:
    """Tenant `slow`: 8 jobs whose reads each hold a slot for 10 s (a `cat` that hangs until the
    exec timeout), each tried again 1 s after it ends or is refused. Tenant `fast`: one job read
    every 1 s, 0.05 s per read. Returns how long each of fast's reads waited for its slot."""
    waits: list[float] = []
    stop = asyncio.Event()

    async def slow_job() -> None:
        while not stop.is_set():
            with contextlib.suppress(Busy):
                async with lim.slot("slow"):
                    await clock.sleep(10.0)
            await clock.sleep(1.0)

    async def fast_job() -> None:
        while not stop.is_set():
            asked = clock.now()
            async with lim.slot("fast"):
                waits.append(clock.now() - asked)
                await clock.sleep(0.05)
            await clock.sleep(1.0)

    tasks = [asyncio.create_task(slow_job()) for _ in range(8)]
    await _run_for(clock, 0.5)  # the slow ones are in first
    tasks.append(asyncio.create_task(fast_job()))
    await _run_for(clock, 60.0)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return waits


async def test_a_slow_tenant_does_not_delay_another() -> None:
    clock = FakeClock()
    fair = FairLimiter(concurrency=4, per_key=2, rate=20.0, burst=20, clock=clock)
    waits = await _tenants(fair, clock)
    assert len(waits) >= 50  # about one read a second for 60 s
    assert max(waits) == 0.0, max(waits)
    assert fair.max_in_flight <= 4 and fair.share.refused > 0

    # The same load on the old shape (one pool, no share: per_key = all the slots) makes the
    # fast tenant wait for a slow holder, seconds at a time: what the share prevents.
    clock = FakeClock()
    pooled = FairLimiter(concurrency=4, per_key=4 + 8, rate=20.0, burst=20, clock=clock)
    waits = await _tenants(pooled, clock)
    assert max(waits) > 5.0, max(waits)


class ShareModel(RuleBasedStateMachine):
    """Whatever the order of arrivals, releases and time: the bounds hold, no slot stays idle
    while someone waits and a token exists, and each grant goes to a key with the fewest
    holders among the waiting keys."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.share = FairShare(concurrency=3, per_key=2, rate=2.0, burst=2, clock=self.clock)
        self.held: list[Ticket] = []
        self.queued: list[Ticket] = []

    def _grant(self) -> None:
        for t in self._checked_grant():
            self.queued.remove(t)
            self.held.append(t)

    def _checked_grant(self) -> list[Ticket]:
        waiting = Counter(t.key for t in self.queued)
        holders = {k: self.share.holders(k) for k in waiting}
        granted = self.share.grant()
        for t in granted:  # in grant order, each against the state just before it
            assert holders[t.key] == min(holders[k] for k, n in waiting.items() if n)
            holders[t.key] += 1
            waiting[t.key] -= 1
        return granted

    @rule(key=st.sampled_from("abc"))
    def enter(self, key: str) -> None:
        try:
            self.queued.append(self.share.enter(key))
        except Busy:
            n = sum(t.key == key for t in self.held + self.queued)
            assert n == self.share.per_key
            return
        self._grant()

    @rule(i=st.integers(0, 10))
    def release(self, i: int) -> None:
        if self.held:
            self.share.release(self.held.pop(i % len(self.held)))
            self._grant()

    @rule(i=st.integers(0, 10))
    def give_up(self, i: int) -> None:
        if self.queued:
            self.share.release(self.queued.pop(i % len(self.queued)))

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0]))
    def tick(self, dt: float) -> None:
        self.clock.step(dt)
        self._grant()

    @invariant()
    def bounded_and_work_conserving(self) -> None:
        assert self.share.in_flight == len(self.held) <= self.share.concurrency
        for key in "abc":
            assert self.share.holders(key) + self.share.waiting(key) <= self.share.per_key
        assert self.share.waiting() == len(self.queued)
        if self.queued and self.share.in_flight < self.share.concurrency:
            wait = self.share.wait_time()
            assert wait is not None and wait > 0  # only the rate holds them back


TestShareModel = ShareModel.TestCase
TestShareModel.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


async def test_slot_is_an_async_context_manager() -> None:
    lim = FairLimiter(concurrency=1, per_key=1, rate=FAST, burst=1, clock=FakeClock())
    cm = lim.slot("k")
    assert isinstance(cm, contextlib.AbstractAsyncContextManager)
    async with cm:
        with pytest.raises(Busy):
            async with lim.slot("k"):
                pass
    assert lim.in_flight == 0
