"""The hand-over's decision (trainer_runtime/handover.py `Watcher`, `grace_of`) and its loop over
a tier's sentinels (`wait_for_saves_in_flight` with a `SentinelSource`), on a fake clock: no
storage, no sleeping. The tiers' own sources are tested against real storage in
test_handover.py (a directory) and test_handover_s3.py (SeaweedFS)."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable

import pytest

from trainer_runtime import handover
from trainer_runtime.handover import STALE_SECONDS, UNKNOWN, Watcher, grace_of

A, B = (0, 20), (1, 3)  # (generation, step)


def test_a_sentinel_that_keeps_changing_is_live_until_it_goes() -> None:
    w = Watcher(start=0.0, timeout=100.0)
    for i in range(30):  # 30 s of beats, far beyond STALE_SECONDS
        assert w.see(float(i), {A: f"etag-{i}"}) == [A]
    assert w.see(30.0, {A: None}) == []  # committed: the sentinel went
    assert w.alive([]) == [20]  # seen beating


def test_an_unchanging_sentinel_is_presumed_live_for_the_stale_time_only() -> None:
    w = Watcher(start=0.0, timeout=100.0)
    assert w.see(0.0, {A: "same"}) == [A]
    assert w.see(STALE_SECONDS - 0.1, {A: "same"}) == [A]
    assert w.see(STALE_SECONDS, {A: "same"}) == []
    assert w.alive([]) == []  # never seen beating: a crash's leftover


def test_the_stale_time_runs_from_the_last_change_by_the_readers_clock() -> None:
    w = Watcher(start=1000.0, timeout=100.0)
    w.see(1000.0, {A: 1})
    w.see(1004.0, {A: 2})  # a beat
    assert w.see(1004.0 + STALE_SECONDS - 0.1, {A: 2}) == [A]
    assert w.see(1004.0 + STALE_SECONDS, {A: 2}) == []


def test_a_look_that_failed_is_no_news() -> None:
    """UNKNOWN (a HEAD that failed) is neither a beat nor the sentinel gone: a writer is not kept
    alive by errors, nor given up on at the first one."""
    w = Watcher(start=0.0, timeout=100.0)
    w.see(0.0, {A: "e1"})
    assert w.see(1.0, {A: UNKNOWN}) == [A]
    assert w.see(2.0, {A: "e2"}) == [A]  # UNKNOWN did not replace the token: e2 is a change
    assert w.see(2.0 + STALE_SECONDS - 0.1, {A: UNKNOWN}) == [A]
    assert w.see(2.0 + STALE_SECONDS, {A: UNKNOWN}) == []
    assert w.alive([]) == [20]


def test_an_unknown_first_look_counts_from_then() -> None:
    w = Watcher(start=0.0, timeout=100.0)
    assert w.see(0.0, {A: UNKNOWN}) == [A]
    assert w.see(1.0, {A: "e1"}) == [A]
    assert w.see(1.0 + STALE_SECONDS, {A: "e1"}) == []


def test_each_sentinel_is_judged_by_itself_in_key_order() -> None:
    w = Watcher(start=0.0, timeout=100.0)
    w.see(0.0, {B: "b", A: "a"})
    assert w.see(3.0, {B: "b2", A: "a"}) == [A, B]
    assert w.see(STALE_SECONDS, {B: "b2", A: "a"}) == [B]
    assert w.see(STALE_SECONDS + 1, {B: None, A: "a"}) == []
    assert w.alive([]) == [3]


def test_the_bound_and_the_writers_grace() -> None:
    w = Watcher(start=10.0, timeout=5.0, extend=True)
    assert not w.over(14.9) and w.over(15.0)
    assert w.ungraced([A, B]) == [A, B]
    assert w.ungraced([A, B]) == []  # each writer's grace is read once
    w.grant(30.0)
    w.grant(2.0)  # a shorter grace never shortens the bound
    assert w.timeout == 30.0 and not w.over(39.9) and w.over(40.0)
    fixed = Watcher(start=0.0, timeout=5.0)  # an explicit timeout: the writers' grace is not read
    assert fixed.ungraced([A]) == []


@pytest.mark.parametrize(
    ("body", "grace"),
    [
        (b'{"graceSeconds": 90}', 90.0),
        (b'{"graceSeconds": "45.5", "beat": 3}', 45.5),
        (b'{"graceSeconds": -4}', 0.0),
        (b'{"graceSeconds": 1e308}', handover.MAX_GRACE_SECONDS),
        (b'{"graceSeconds": 1e999}', 0.0),  # inf
        (b'{"graceSeconds": NaN}', 0.0),
        (b'{"graceSeconds": "x"}', 0.0),
        (b'{"graceSeconds": [1]}', 0.0),
        (b'{"graceSeconds": null}', 0.0),
        (b"[1, 2]", 0.0),
        (b"being uploaded\n", 0.0),  # what an older runtime's s3:// sentinel says
        (b"", 0.0),
        (b"\xff\xfe\x00garbage", 0.0),
        (b"[" * 4096, 0.0),  # nested past the recursion limit
        (b'{"graceSeconds": 60, "pad": "' + b"x" * 5000, 0.0),  # cut at RECORD_BYTES
    ],
)
def test_the_writers_grace_from_any_body(body: bytes, grace: float) -> None:
    assert grace_of(body[: handover.RECORD_BYTES]) == grace


class FakeTime:
    def __init__(self, on_sleep: Callable[[float], None] = lambda now: None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        self.on_sleep(self.now)


class FakeSource:
    """Sentinels as a dict (key -> token), with counts of the calls: a tier's source without
    storage."""

    where = "fake://"
    poll_seconds = 0.5
    list_seconds = 2.0

    def __init__(self, sentinels: dict[tuple[int, int], Hashable | None]) -> None:
        self.sentinels = sentinels
        self.records: dict[tuple[int, int], bytes] = {}
        self.lists = self.looks = self.reads = 0
        self.list_error: Exception | None = None

    def pending(self) -> dict[tuple[int, int], tuple[int, int]]:
        self.lists += 1
        if self.list_error is not None:
            raise self.list_error
        return {k: k for k, token in self.sentinels.items() if token is not None}

    def token(self, handle: tuple[int, int]) -> Hashable | None:
        self.looks += 1
        return self.sentinels.get(handle)

    def record(self, handle: tuple[int, int]) -> bytes:
        self.reads += 1
        return self.records.get(handle, b"")


def test_the_wait_follows_a_beating_writer_to_its_commit_at_a_bounded_rate() -> None:
    source = FakeSource({A: 0})

    def writer(now: float) -> None:  # beats every second, commits at 12 s
        source.sentinels[A] = None if now >= 12 else int(now)

    t = FakeTime(writer)
    assert handover.wait_for_saves_in_flight(source, timeout=60, clock=t.clock, sleep=t.sleep) == [
        20
    ]
    assert t.now == 12.0
    assert t.sleeps == 24  # one look per poll_seconds
    assert source.looks == 24  # one token per pending sentinel per look (none at 12 s: gone)
    assert source.lists == 7  # 0, 2, ..., 12 s: every list_seconds
    assert source.reads == 0  # an explicit timeout: no grace read


def test_the_wait_gives_up_on_a_silent_writer_after_the_stale_time() -> None:
    source = FakeSource({A: "left by a crash"})
    t = FakeTime()
    assert handover.wait_for_saves_in_flight(source, timeout=60, clock=t.clock, sleep=t.sleep) == []
    assert t.now == STALE_SECONDS


def test_the_wait_ends_at_the_bound_lengthened_by_the_writers_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "3")  # the reader's own
    source = FakeSource({A: 0})
    source.records[A] = json.dumps({"graceSeconds": 8}).encode()

    def writer(now: float) -> None:  # beats forever
        source.sentinels[A] = now

    t = FakeTime(writer)
    assert handover.wait_for_saves_in_flight(source, clock=t.clock, sleep=t.sleep) == [20]
    assert t.now == 8.0
    assert source.reads == 1
    t = FakeTime(writer)
    source.records[A] = b"\x00" * 10_000  # a hostile body: the reader's own bound
    assert handover.wait_for_saves_in_flight(source, clock=t.clock, sleep=t.sleep) == [20]
    assert t.now == 3.0


def test_a_save_that_starts_during_the_wait_is_found_by_a_later_listing() -> None:
    source = FakeSource({A: 0})

    def world(now: float) -> None:
        source.sentinels[A] = None if now >= 3 else now  # A commits at 3 s ...
        if now >= 1:
            source.sentinels[B] = None if now >= 6 else now  # ... B begins at 1 s, ends at 6 s

    t = FakeTime(world)
    assert handover.wait_for_saves_in_flight(source, timeout=60, clock=t.clock, sleep=t.sleep) == [
        3,
        20,
    ]
    assert t.now == 6.0


def test_a_failing_listing_raises_at_first_and_is_survived_later() -> None:
    source = FakeSource({A: 0})
    source.list_error = OSError("bucket unreachable")
    with pytest.raises(OSError, match="unreachable"):
        handover.wait_for_saves_in_flight(source, timeout=60, clock=FakeTime().clock)

    source = FakeSource({A: 0})

    def world(now: float) -> None:
        source.list_error = OSError("throttled")  # every listing after the first
        source.sentinels[A] = None if now >= 5 else now

    t = FakeTime(world)
    assert handover.wait_for_saves_in_flight(source, timeout=60, clock=t.clock, sleep=t.sleep) == [
        20
    ]
    assert t.now == 5.0
