"""Stops that are never lost: honoured while the training thread is away from a step boundary.

The per-step agreement sees a stop only at a step boundary. A preemption that arrives during a
long evaluation, a long wait for data, or the first compile would wait for the next boundary, and
the grace period often ends first (0 of 6 preemptions saved in one public report). So a watcher
thread per rank, on an agreement of its own, asks every `poll` seconds:

    any rank asked to stop?          -> every rank's next step boundary votes stop (it spreads)
    any rank's stop overdue?         -> take over: the ranks agree on the last completed
                                        optimizer step T (the max over ranks), hold further
                                        optimizer steps, save T from the watcher thread, answer
                                        preStop; the training thread stops at its next boundary
    any rank closing?                -> every watcher ends (no rank is left waiting)

A stop is overdue on a rank once it has been pending for `takeover_after` seconds (a few step
times, capped by a fraction of the grace period) and that rank's training thread has not reached
a step boundary in that time. Exactly one actor per rank saves: the training thread when it gets
there first, else the watcher (`JitStop.owner`, claimed once). A rank whose completed step does
not reach T in time makes the stop fail on every rank, and the progress record says why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ..protocol import Agreement, Staged
from ..protocol.commit import describe
from .triggers import Triggers

log = logging.getLogger("trainer_runtime.stop")

DEFAULT_POLL_SECONDS = 0.5


class WatchedStop(Protocol):
    """What the watcher reads and drives of its rank's stop (jit.JitStop)."""

    triggers: Triggers
    stopped: bool
    boundary_time: float

    @property
    def claimed(self) -> bool:
        """Someone (the training thread, or this watcher) saves the stop already."""

    @property
    def completed_step(self) -> int: ...

    def claim_for_watcher(self) -> bool:
        """Make the watcher the one that saves the stop; False if the training thread is."""

    def hold_updates(self, at: int) -> None: ...

    def release_updates(self) -> None: ...

    def save_from_watcher(self, step: int, stage: Callable[[], Staged]) -> bool: ...

    def fail(self, step: int, why: str) -> None: ...


class StopWatcher(threading.Thread):
    def __init__(
        self,
        stop: WatchedStop,
        ctl: Agreement,
        stage: Callable[[int], Staged] | None,
        *,
        takeover_after: Callable[[], float],
        reach_timeout: float,
        poll: float = DEFAULT_POLL_SECONDS,
    ) -> None:
        super().__init__(name="kubeckpt-stop-watcher", daemon=True)
        self.stop = stop
        self.ctl = ctl
        self.stage = stage
        self.takeover_after = takeover_after
        self.reach_timeout = reach_timeout
        self.poll = poll
        self._closing = threading.Event()
        self._ended = threading.Event()
        self.took_over = False
        self._requested_at: float | None = None

    def close(self, timeout: float | None = None) -> None:
        """Ask the watcher to end at its next round (every rank's watcher ends with it)."""
        self._closing.set()
        if self.is_alive():
            self._ended.wait(timeout)

    def run(self) -> None:
        try:
            while True:
                self._closing.wait(self.poll)
                closing = self._closing.is_set()
                requested = self.stop.triggers.requested()
                now = time.monotonic()
                if requested and self._requested_at is None:
                    self._requested_at = now
                overdue = self._overdue(now)
                any_requested, any_overdue, any_closing = self.ctl.all_max(
                    [int(requested), int(overdue), int(closing)]
                )
                if any_closing and not any_overdue:
                    return
                if any_requested:
                    self.stop.triggers.remote = True  # this rank's next boundary votes stop too
                    if self._requested_at is None:
                        self._requested_at = now
                if any_overdue:
                    self._take_over()
                    return
        except Exception as e:  # a rank went away: the per-step path is all that is left
            log.warning("kubeckpt: the stop watcher ended: %s", describe(e))
        finally:
            self._ended.set()

    def _overdue(self, now: float) -> bool:
        stop = self.stop
        if self.stage is None or self._requested_at is None:
            return False
        if stop.stopped or stop.claimed:
            return False
        wait = self.takeover_after()
        return now - self._requested_at >= wait and now - stop.boundary_time >= wait

    def _take_over(self) -> None:
        """Every rank's watcher is here at the same round."""
        stop = self.stop
        completed = self.ctl.all_gather(stop.completed_step)
        target = max(completed)
        mine = stop.claim_for_watcher()
        # Hold optimizer steps past the target (the adapter's pre-step hook waits); a rank one
        # step behind finishes its step: in data-parallel training it is in its optimizer step.
        stop.hold_updates(target)
        deadline = time.monotonic() + self.reach_timeout
        while stop.completed_step < target and time.monotonic() < deadline:
            time.sleep(0.01)
        reached = stop.completed_step == target
        agreed = self.ctl.all_ok(reached)
        if not mine:
            return  # this rank's training thread is saving (at the same step: it is parked there)
        self.took_over = True
        try:
            if not agreed:
                behind = [r for r, s in enumerate(completed) if s != target]
                why = (
                    f"rank(s) {behind or 'unknown'} did not reach step {target} in time "
                    "(away from a step boundary)"
                )
                if not reached:
                    why = f"this rank stayed at step {stop.completed_step}; others are at {target}"
                stop.fail(target, why)
                return
            log.warning(
                "kubeckpt: stop requested away from a step boundary; saving step %d now", target
            )
            stage = self.stage
            assert stage is not None  # no rank votes overdue without one
            stop.save_from_watcher(target, lambda: stage(target))
        finally:
            stop.release_updates()
