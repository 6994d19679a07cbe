"""The review engine itself (metrics_auth and push_auth each test it through their own checks):
a verdict is reused for its ttl and no longer, one with no lifetime is not kept, a failed review
is the caller's `unavailable` answer and asked again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from reconciler.clock import FakeClock
from reconciler.errors import ServiceUnavailable
from reconciler.review_budget import ReviewBudget, Verdict


def budget(clock: FakeClock) -> ReviewBudget[str, str]:
    return ReviewBudget(
        over_budget="429",
        unavailable=lambda e: f"503 {type(e).__name__}",
        max_entries=8,
        rate=100,
        burst=100,
        max_in_flight=4,
        review_timeout=1.0,
        clock=clock,
    )


async def test_verdicts_are_reused_for_their_ttl_only() -> None:
    clock = FakeClock()
    rb = budget(clock)
    asked: list[str] = []

    def review(answer: str, good: bool, ttl: float) -> Callable[[], Awaitable[Verdict[str]]]:
        async def ask() -> Verdict[str]:
            asked.append(answer)
            return Verdict(answer, good, ttl)

        return ask

    assert await rb.answer("a", review("ok", True, 10)) == "ok"
    assert await rb.answer("a", review("other", True, 10)) == "ok"  # cached
    assert await rb.answer("b", review("no", False, 0)) == "no"
    assert await rb.answer("b", review("no", False, 0)) == "no"  # ttl 0: asked again
    clock.step(10)
    assert await rb.answer("a", review("later", True, 10)) == "later"  # expired
    assert asked == ["ok", "no", "no", "later"]
    assert rb.stats == {"reviews": 4, "cached": 1, "joined": 0, "over_budget": 0}
    assert len(rb.good) == 1 and len(rb.refused) == 0


async def test_a_failed_review_is_unavailable_and_not_cached() -> None:
    rb = budget(FakeClock())

    async def down() -> Verdict[str]:
        raise ServiceUnavailable(503, "down")

    async def up() -> Verdict[str]:
        return Verdict("ok", True, 60)

    assert await rb.answer("a", down) == "503 ServiceUnavailable"
    assert await rb.answer("a", up) == "ok"
