"""Work queue semantics with deterministic time (FakeClock): no sleeps anywhere."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reconciler.clock import FakeClock
from reconciler.ratelimit import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
)
from reconciler.workqueue import QueueEmpty, ShutDown, WorkQueue

ITEMS = st.sampled_from("abcdef")


class QueueModel(RuleBasedStateMachine):
    """The queue against a reference model of client-go's Type + delaying queue."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.q: WorkQueue[str] = WorkQueue("model", clock=self.clock)
        self.queue: list[str] = []
        self.dirty: set[str] = set()
        self.processing: set[str] = set()
        self.waiting: dict[str, tuple[float, int]] = {}
        self.seq = 0
        self.shut = False

    def _add(self, x: str) -> None:
        if self.shut or x in self.dirty:
            return
        self.dirty.add(x)
        if x not in self.processing:
            self.queue.append(x)

    @rule(x=ITEMS)
    def add(self, x: str) -> None:
        self.q.add(x)
        self._add(x)

    @rule()
    def get(self) -> None:
        if self.queue:
            x = self.queue.pop(0)
            self.processing.add(x)
            self.dirty.discard(x)
            assert self.q.try_get() == x
        else:
            with pytest.raises(ShutDown if self.shut else QueueEmpty):
                self.q.try_get()

    @precondition(lambda self: self.processing)
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        x = data.draw(st.sampled_from(sorted(self.processing)))
        self.q.done(x)
        self.processing.discard(x)
        if x in self.dirty:
            self.queue.append(x)

    @rule(x=ITEMS, delay=st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0]))
    def add_after(self, x: str, delay: float) -> None:
        self.q.add_after(x, delay)
        if self.shut:
            return
        if delay <= 0:
            self._add(x)
            return
        ready = self.clock.now() + delay
        if x not in self.waiting or ready < self.waiting[x][0]:
            self.waiting[x] = (ready, self.seq)
            self.seq += 1

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 3.0]))
    def step(self, dt: float) -> None:
        self.clock.step(dt)
        now = self.clock.now()
        # Due items are added in deadline order, ties in the order they were delayed.
        due = sorted((t, x) for x, t in self.waiting.items() if t[0] <= now)
        for _, x in due:
            del self.waiting[x]
            self._add(x)

    @rule()
    def shutdown(self) -> None:
        self.q.shutdown()
        self.shut = True
        self.waiting.clear()

    @invariant()
    def matches_model(self) -> None:
        assert list(self.q._queue) == self.queue
        assert self.q._processing == self.processing
        assert self.q._dirty == self.dirty
        assert len(self.q) == len(self.queue)
        assert self.q.waiting == len(self.waiting)

    @invariant()
    def never_queued_twice_nor_while_processing(self) -> None:
        queued = list(self.q._queue)
        assert len(queued) == len(set(queued))
        assert not set(queued) & self.q._processing


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_added_many_times_queued_once() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.try_get() == "a"
    assert q.try_get() == "b"
    with pytest.raises(QueueEmpty):
        q.try_get()


def test_added_while_processing_is_requeued_after_done() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    q.add("a")
    assert q.try_get() == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0, "not handed to a second worker while the first has it"
    q.done("a")
    assert len(q) == 1
    assert q.try_get() == "a"
    q.done("a")
    assert len(q) == 0


def test_add_after_fires_at_its_deadline_and_earliest_wins() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 3)  # earlier wins
    q.add_after("a", 20)  # later is ignored
    q.add_after("b", 5)
    clock.step(2.999)
    assert len(q) == 0 and q.waiting == 2
    clock.step(0.001)
    assert q.try_get() == "a"
    clock.step(2)
    assert q.try_get() == "b"
    clock.step(100)
    with pytest.raises(QueueEmpty):
        q.try_get()


def test_rate_limited_backoff_doubles_per_item_and_forget_resets() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(
        clock=clock, rate_limiter=ItemExponentialFailureRateLimiter(0.005, 1000)
    )
    expected = [0.005, 0.01, 0.02, 0.04]
    for n, delay in enumerate(expected):
        assert q.num_requeues("a") == n
        q.add_rate_limited("a")
        clock.step(delay * 0.999)
        assert len(q) == 0, f"retry {n} came before {delay}s"
        clock.step(delay * 0.002)
        assert q.try_get() == "a"
        q.done("a")
    q.forget("a")
    assert q.num_requeues("a") == 0
    q.add_rate_limited("a")
    clock.step(0.005)
    assert len(q) == 1


def test_shutdown_hands_out_queued_items_then_raises_and_ignores_adds() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("a")
    q.add_after("b", 1)
    q.shutdown()
    q.add("c")
    clock.step(2)
    assert q.try_get() == "a"
    with pytest.raises(ShutDown):
        q.try_get()


async def test_get_waits_for_an_add() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.add("x")
    assert await getter == "x"


async def test_get_raises_shutdown_for_waiting_workers() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.shutdown()
    results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(r, ShutDown) for r in results)


async def test_cancelled_getter_passes_its_wakeup_on() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("x")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    await asyncio.gather(first, return_exceptions=True)
    assert await second == "x"


async def test_shutdown_with_drain_waits_for_queued_and_in_flight_items() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    q.add("a")
    q.add("b")
    assert q.try_get() == "a"
    drain = asyncio.create_task(q.shutdown_with_drain())
    await asyncio.sleep(0)
    assert not drain.done()
    q.done("a")
    await asyncio.sleep(0)
    assert not drain.done(), "b is still queued"
    assert q.try_get() == "b"
    q.done("b")
    await drain


async def test_concurrent_workers_never_share_an_item() -> None:
    q: WorkQueue[int] = WorkQueue(clock=FakeClock())
    active: set[int] = set()
    processed: list[int] = []

    async def worker() -> None:
        while True:
            try:
                item = await q.get()
            except ShutDown:
                return
            assert item not in active, f"{item} handed to two workers"
            active.add(item)
            for _ in range(3):
                await asyncio.sleep(0)  # yield, so other workers run meanwhile
                q.add(item % 5)  # re-add items that may be in flight
            active.discard(item)
            processed.append(item)
            q.done(item)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for i in range(50):
        q.add(i % 7)
        await asyncio.sleep(0)
    await q.shutdown_with_drain()
    await asyncio.gather(*workers)
    assert set(processed) == set(range(7))


def test_default_limiter_combines_backoff_and_overall_bucket() -> None:
    clock = FakeClock()
    lim = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000), BucketRateLimiter(10, 100, clock)
    )
    delays = [lim.when(i) for i in range(100)]
    assert delays == [0.005] * 100, "burst of 100 distinct items: only the per-item backoff"
    assert lim.when(100) == pytest.approx(0.1), "the 101st waits for the bucket (10/s)"
    assert lim.when(101) == pytest.approx(0.2)
    clock.step(1000)
    assert [lim.when("x") for _ in range(3)] == [0.005, 0.01, 0.02]
    assert lim.num_requeues("x") == 3
    lim.forget("x")
    assert lim.when("x") == 0.005
