"""AimdRate: the configured QPS is a ceiling the API server's 429s lower and time restores."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.clock import FakeClock
from reconciler.ratelimit import AimdRate, TokenBucket


def test_starts_at_the_ceiling_and_halves_on_a_429() -> None:
    clock = FakeClock()
    aimd = AimdRate(100.0, clock=clock)
    assert aimd.rate() == 100.0
    assert aimd.throttled() == 50.0
    assert aimd.rate() == 50.0
    assert aimd.decreases == 1


def test_a_burst_of_429s_within_the_hold_halves_once() -> None:
    clock = FakeClock()
    aimd = AimdRate(100.0, hold=1.0, clock=clock)
    for _ in range(20):  # answers to requests sent at the old rate
        aimd.throttled()
        clock.step(0.01)
    assert aimd.decreases == 1
    clock.step(1.0)
    aimd.throttled()
    assert aimd.decreases == 2
    assert aimd.rate() == pytest.approx((50.0 + 1.0 * 1.2) * 0.5)  # 1.2 s of recovery, then halved


def test_recovers_additively_to_the_ceiling_and_no_further() -> None:
    clock = FakeClock()
    aimd = AimdRate(100.0, increase=2.0, clock=clock)
    aimd.throttled()
    clock.step(10.0)
    assert aimd.rate() == pytest.approx(70.0)
    clock.step(1000.0)
    assert aimd.rate() == 100.0


def test_no_recovery_before_the_servers_retry_after() -> None:
    clock = FakeClock()
    aimd = AimdRate(100.0, increase=5.0, clock=clock)
    aimd.throttled(retry_after=4.0)
    clock.step(3.0)
    assert aimd.rate() == 50.0
    aimd.throttled()  # still inside the server's wait: not a second decrease
    assert aimd.decreases == 1
    clock.step(2.0)
    assert aimd.rate() == pytest.approx(55.0)


def test_never_below_the_floor() -> None:
    clock = FakeClock()
    aimd = AimdRate(8.0, floor=2.0, hold=0.0, clock=clock)
    for _ in range(10):
        aimd.throttled()
    assert aimd.rate() == 2.0


@pytest.mark.parametrize(
    "kw", [{"floor": 0.0}, {"floor": 200.0}, {"decrease": 1.0}, {"increase": 0.0}, {"hold": -1}]
)
def test_bad_settings_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AimdRate(100.0, **kw)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 5)), max_size=50))
def test_rate_stays_within_floor_and_ceiling(events: list[tuple[bool, float]]) -> None:
    clock = FakeClock()
    aimd = AimdRate(50.0, floor=1.0, clock=clock)
    for refused, dt in events:
        clock.step(dt)
        if refused:
            aimd.throttled()
        assert 1.0 <= aimd.rate() <= 50.0


def test_bucket_set_rate_keeps_tokens_earned_at_the_old_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, 100, clock)
    for _ in range(100):
        bucket.try_take()
    clock.step(1.0)  # 10 tokens at the old rate
    bucket.set_rate(1.0)
    assert bucket.tokens == pytest.approx(10.0)
    clock.step(1.0)
    assert bucket.tokens == pytest.approx(11.0)
    with pytest.raises(ValueError):
        bucket.set_rate(0.0)
