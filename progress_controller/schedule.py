"""When to poll each job next, and the bound on execs (global, and fair between namespaces).

Intervals (the seed's): `early` while a job has not reported yet or is young, `recent` while its
step changed lately, `stale` otherwise; never shorter than the file's own update period
(stepSeconds x PROGRESS_UPDATE_FREQUENCY), with upward jitter (so the floor holds and jobs drift
apart). All of them are settings, so tests can run at 1 s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kubeckpt_api.status_bounds import MAX_STEP_SECONDS, MAX_UPDATE_PERIOD
from reconciler.clock import REAL_CLOCK, Clock
from reconciler.fairlimit import FairLimiter


@dataclass(frozen=True)
class PollSettings:
    early: float = 15.0
    recent: float = 30.0
    stale: float = 60.0
    early_window: float = 300.0  # a job is "early" this long after it is first seen
    recent_window: float = 180.0  # a step change within this long is "recent"
    jitter: float = 0.1  # up to +10%
    stall_floor: float = 60.0  # Stalled needs at least this long without a step
    stall_periods: float = 3.0  # ... and at least this many update periods

    def scaled(self, factor: float) -> PollSettings:
        return PollSettings(
            *(
                v * factor
                for v in (
                    self.early,
                    self.recent,
                    self.stale,
                    self.early_window,
                    self.recent_window,
                )
            ),
            jitter=self.jitter,
            stall_floor=self.stall_floor * factor,
            stall_periods=self.stall_periods,
        )


def update_period(step_seconds: float | None, frequency: int) -> float | None:
    """Seconds between progress file writes, when the record says how long a step takes.

    Both factors come from the pod, so the product is cut to MAX_UPDATE_PERIOD: whatever they
    claim, a job is read at least that often and can be found Stalled."""
    if step_seconds is None or not 0 < step_seconds <= MAX_STEP_SECONDS:
        return None
    return min(step_seconds * max(frequency, 1), MAX_UPDATE_PERIOD)


def poll_interval(
    settings: PollSettings,
    *,
    has_record: bool,
    age: float,
    since_change: float | None,
    period: float | None,
    rand: random.Random | None = None,
) -> float:
    """Seconds until the next read of a job."""
    if not has_record or age < settings.early_window:
        base = settings.early
    elif since_change is not None and since_change < settings.recent_window:
        base = settings.recent
    else:
        base = settings.stale
    if period is not None:
        base = max(base, period)
    r = (rand or random).random()
    return base * (1.0 + settings.jitter * r)


# Push intervals are measured from the pushes themselves; these bound what a pod can make of them
# (a push every millisecond must not make its job's overdue check fire at once, and a claimed hour
# must not keep the job unread for long).
MIN_PUSH_INTERVAL = 1.0
MAX_PUSH_INTERVAL = 300.0
PUSH_OVERDUE_FACTOR = 2.0


def push_fresh_until(
    last_push: float | None, push_interval: float | None, default_interval: float
) -> float:
    """Until when a job that pushes is not read by exec: its last push plus twice the interval
    between its last two pushes (`default_interval` after the first push). -inf without a push:
    a job that never pushed, or stopped long ago, is polled as before."""
    if last_push is None:
        return float("-inf")
    interval = push_interval if push_interval is not None else default_interval
    interval = min(max(interval, MIN_PUSH_INTERVAL), MAX_PUSH_INTERVAL)
    return last_push + PUSH_OVERDUE_FACTOR * interval


def stall_after(settings: PollSettings, period: float | None) -> float:
    """Seconds without a step before a job is Stalled: at least 3 update periods."""
    if period is None:
        return settings.stall_floor
    return max(settings.stall_floor, settings.stall_periods * period)


class ExecLimiter(FairLimiter):
    """The bound on execs: at most `concurrency` at once and `rate` per second (burst `burst`) in
    all, and at most `per_namespace` in flight or waiting per namespace (default: half the
    slots), shared fairly between namespaces (reconciler.fairlimit).

    A slot is held for the whole read, so without the per-namespace bound a few pods whose `cat`
    is slow (or hangs until the exec timeout) held every slot and every other job's status
    waited. Now one namespace holds at most its share; a read refused because its namespace is at
    it (`Busy`) is tried again after `retry_after()`, without holding a worker meanwhile.
    """

    def __init__(
        self,
        concurrency: int = 10,
        rate: float = 20.0,
        burst: int = 20,
        per_namespace: int | None = None,
        clock: Clock = REAL_CLOCK,
        busy_retry: float = 1.0,
    ) -> None:
        per_ns = per_namespace if per_namespace else max(1, concurrency // 2)
        super().__init__(concurrency, per_ns, rate, burst, clock)
        self.per_namespace = per_ns
        self.busy_retry = busy_retry

    def retry_after(self, rand: random.Random | None = None) -> float:
        """Seconds until a read refused as Busy is tried again (jittered up to 2x, so that a
        namespace's refused jobs do not all come back together)."""
        return self.busy_retry * (1.0 + (rand or random).random())
