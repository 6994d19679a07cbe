"""hack/bench/progress_push_bench.py's pure helpers: the figures in docs/benchmarks.md's push
section rest on the percentile, the push schedule and the freshness join."""

from __future__ import annotations

import json

import pytest
from bench.progress_push_bench import (
    Push,
    freshness,
    percentile,
    period_order,
    phases,
    trainer_body,
)

from progress_controller.push_body import parse_push


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]  # 1..20, shuffled order must not matter
    assert percentile(list(reversed(values)), 0.95) == 19.0
    assert percentile(values, 0.5) == 10.0
    assert percentile(values, 1.0) == 20.0
    assert percentile(values, 0.0) == 1.0
    assert percentile([3.5], 0.95) == 3.5
    assert percentile([], 0.95) is None


def test_phases_spread_in_job_order_or_fixed_random() -> None:
    assert phases(4, random_phase=False) == [0.0, 0.25, 0.5, 0.75]
    assert phases(0, random_phase=False) == []
    a, b = phases(100, random_phase=True, seed=3), phases(100, random_phase=True, seed=3)
    assert a == b and all(0 <= x < 1 for x in a)
    assert a != phases(100, random_phase=True, seed=4)


def test_each_period_has_one_push_per_job_at_its_phase_in_due_order() -> None:
    offsets = [0.5, 0.0, 0.9]
    assert period_order(offsets, 100.0, 10.0, 0) == [(100.0, 1), (105.0, 0), (109.0, 2)]
    assert period_order(offsets, 100.0, 10.0, 2) == [(120.0, 1), (125.0, 0), (129.0, 2)]


def test_freshness_counts_from_sending_to_the_first_status_at_that_step_or_later() -> None:
    seen = {"a": [(10.0, 1), (12.5, 2), (30.0, 4)], "b": [(5.0, 1)]}
    pushes = [
        Push("a", 2, due=11.0, sent=11.0, done=11.1, code=200),  # shown at 12.5
        Push("a", 3, due=21.0, sent=21.5, done=21.6, code=200),  # overtaken: step 4 at 30.0
        Push("a", 5, due=31.0, sent=31.0, done=31.1, code=200),  # never shown
        Push("b", 2, due=1.0, sent=1.0, done=1.1, code=429),  # refused: not a sample
        Push("c", 2, due=1.0, sent=1.0, done=1.0, code=200),  # no status at all
    ]
    lags, unseen = freshness(pushes, seen)
    assert lags == pytest.approx([1.5, 8.5])
    assert unseen == 2


def test_the_generators_body_is_one_the_endpoint_accepts_with_its_step() -> None:
    body = trainer_body(42)
    assert set(json.loads(body)) == {"trainerStatus"}
    record = parse_push(body)
    assert record is not None and record.step == 42
