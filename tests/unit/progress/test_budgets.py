"""Budgets sized from the fleet, and the reconciler's flags that default to them."""

from __future__ import annotations

import pytest

from progress_controller.budgets import BudgetError, size_budgets
from progress_controller.main import parse_args


def test_a_thousand_jobs_every_15s_get_room_for_each_poll() -> None:
    b = size_budgets(1000, 15.0)
    # 1000 / 15 = 67 polls/s, each one exec and at most one write, with 1.5x headroom.
    assert b.exec_qps == 100 and b.write_qps == 100
    assert b.exec_qps >= 1000 / 15.0 * 1.1  # the +10 % jitter never starves the schedule
    assert b.max_concurrent_execs == 30  # 100/s x 0.3 s a read
    assert b.write_burst >= b.write_qps


def test_small_fleets_keep_client_gos_floor() -> None:
    b = size_budgets(10, 15.0)
    assert (b.exec_qps, b.write_qps, b.max_concurrent_execs) == (20, 20, 10)


def test_budget_grows_with_the_fleet() -> None:
    assert size_budgets(5000, 15.0).exec_qps == 500
    assert size_budgets(5000, 15.0).max_concurrent_execs == 150


@pytest.mark.parametrize(
    ("jobs", "interval", "kw"),
    [(0, 15.0, {}), (10, 0.0, {}), (10, 15.0, {"read_seconds": 0}), (10, 15.0, {"headroom": 0.5})],
)
def test_bad_inputs_are_refused_with_a_typed_error(jobs, interval, kw) -> None:
    with pytest.raises(BudgetError):
        size_budgets(jobs, interval, **kw)


def test_flags_default_to_the_sized_budgets_and_explicit_flags_win() -> None:
    a = parse_args([])
    assert (a.qps, a.burst, a.exec_qps, a.exec_burst, a.max_concurrent_execs) == (
        100,
        150,
        100,
        50,
        30,
    )
    assert a.adaptive_qps is True
    a = parse_args(["--fleet-size", "3000", "--exec-qps", "7"])
    assert a.exec_qps == 7.0 and a.qps == 300


def test_a_bad_fleet_size_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--fleet-size", "0"])
