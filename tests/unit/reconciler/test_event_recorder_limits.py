"""The recorder's caller-side behaviour: never blocks, drops when full, rate-limits per object.
(Aggregation and writes are tested against the real API server.)"""

from __future__ import annotations

from reconciler.client import Client
from reconciler.clock import FakeClock
from reconciler.config import ClientConfig
from reconciler.events import MAX_MESSAGE, EventRecorder


def obj(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"}}


def recorder(clock: FakeClock, **kw: int) -> EventRecorder:
    # Nothing is sent: run() is never started.
    return EventRecorder(Client(ClientConfig("http://127.0.0.1:9")), "test", clock=clock, **kw)


def test_per_object_spam_filter_refills_slowly() -> None:
    clock = FakeClock()
    rec = recorder(clock, queue_size=1000)
    accepted = [rec.event(obj("a"), "Normal", "R", f"m{i}") for i in range(30)]
    assert accepted == [True] * 25 + [False] * 5, "burst 25 per object"
    assert rec.event(obj("b"), "Normal", "R", "m"), "another object has its own bucket"
    clock.step(299)
    assert not rec.event(obj("a"), "Normal", "R", "m")
    clock.step(1)
    assert rec.event(obj("a"), "Normal", "R", "m"), "one token per 5 minutes"
    assert rec.stats["dropped_spam"] == 6


def test_full_queue_drops_without_blocking() -> None:
    rec = recorder(FakeClock(), queue_size=3)
    results = [rec.event(obj(f"o{i}"), "Warning", "R", "m") for i in range(5)]
    assert results == [True, True, True, False, False]
    assert rec.stats["dropped_full"] == 2
    assert rec.pending == 3


def test_long_messages_are_truncated_to_the_api_limit() -> None:
    rec = recorder(FakeClock())
    rec.event(obj("a"), "Normal", "R", "x" * 5000)
    assert len(rec._queue.get_nowait().message) == MAX_MESSAGE
