"""One rank's just-in-time stop, from the trigger to the hand-over to the exit.

    stop = JitStop(ckpt)                      # installs the SIGTERM handler; reads the request file
    ...each optimizer step...
    d = stop.decide(step)                     # Checkpointer.decide with this rank's stop vote in it
    if d.stop: stop.save_at(step, stage)      # the save, then the preStop answer; the loop ends
    stop.close(final_record)                  # the watcher, the save in flight, the signals
    sys.exit(stop.exit_code)

A stop asked of any rank (triggers.py) rides in the per-step agreement, so every rank stops at the
same step boundary and the training thread saves it there. One that finds the training thread
away from a boundary (an evaluation, a data wait) is saved by the stop watcher (watcher.py) at the
last completed optimizer step, with further optimizer steps held. Exactly one of the two saves a
rank's stop (its `owner`, claimed once). Either way local rank 0 answers preStop once the
checkpoint is durable or has failed, and the process exits with `exit_code`. The checkpointer
(protocol/) only schedules, saves and restores; this holds the stop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from ..contract import (
    PREEMPTED_EXIT_CODE,
    REASON_JIT,
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
    ProgressRecord,
)
from ..protocol import Agreement, Checkpointer, SaveResult, Staged, StepDecision
from .triggers import Triggers
from .watcher import StopWatcher

log = logging.getLogger("trainer_runtime.stop")


def exit_code(stopped: bool) -> int:
    """The process's exit code after training, decided here once for every adapter (the
    zero-code hook takes it from the callbacks): 0, or PREEMPTED_EXIT_CODE (143) after a
    just-in-time stop, so that the job controller restarts the job instead of counting the
    preempted pod a success."""
    return PREEMPTED_EXIT_CODE if stopped else 0


class StopOwner(Enum):
    """Who saves a rank's stop: exactly one actor, claimed once."""

    TRAINING = "training"  # the training thread, at a step boundary
    WATCHER = "watcher"  # the stop watcher's thread, away from one (watcher.py)


class JitStop:
    def __init__(self, ckpt: Checkpointer) -> None:
        self.ckpt = ckpt
        s = ckpt.config.settings
        jit = ckpt.enabled and s.jit
        self.triggers = Triggers(s.control_dir if jit else None, answers=ckpt.me.local_rank == 0)
        self.triggers.install()
        self.stopped = False  # the stop's checkpoint was taken (or its attempt ended)
        self.closed = False
        self.owner: StopOwner | None = None  # who saves this rank's stop (None: nobody yet)
        self._owner_lock = threading.Lock()
        self._finished = threading.Event()
        self._ok = False
        # Where the training thread is (watcher.py): its last step boundary, and whether an
        # optimizer step has completed since (the adapter's post-step hook says so).
        self.boundary_step = 0
        self.boundary_time = time.monotonic()
        self._updated = False
        self._hold_at: int | None = None
        self._released = threading.Event()
        self._released.set()
        self.watcher: StopWatcher | None = None

    @property
    def watcher_ended(self) -> bool:
        """No stop watcher thread runs (none started, or it returned): none is in a collective
        on its agreement group (a rank gone), so the group can be destroyed."""
        return self.watcher is None or not self.watcher.is_alive()

    @property
    def exit_code(self) -> int:
        return exit_code(self.stopped)

    def claim(self, who: StopOwner) -> bool:
        """Make `who` the owner unless another actor is already; whether `who` owns it."""
        with self._owner_lock:
            if self.owner is None:
                self.owner = who
            return self.owner is who

    @property
    def claimed(self) -> bool:
        return self.owner is not None

    def claim_for_watcher(self) -> bool:
        return self.claim(StopOwner.WATCHER)

    # ------------------------------------------------------------------ at a step boundary

    def decide(
        self, step: int, *, end_of_epoch: bool = False, also_persistent: bool = False
    ) -> StepDecision:
        """At the end of an optimizer step: stop, save, or go on, the same on every rank
        (Checkpointer.decide, with this rank's stop vote in the same agreement round)."""
        self.ckpt.observe(step)
        self.at_boundary(step)
        if self.owner is StopOwner.WATCHER:
            self.after_stop()  # parked here until the watcher's save is durable
            return StepDecision(stop=True)
        if self.stopped:
            return StepDecision(stop=True)
        return self.ckpt.decide(
            step,
            stop_vote=self.triggers.pending(),
            end_of_epoch=end_of_epoch,
            also_persistent=also_persistent,
        )

    def save_at(self, step: int, stage: Callable[[], Staged]) -> bool:
        """The training thread's stop at `step`: the just-in-time save, then the preStop answer;
        True when it is durable."""
        if not self.claim(StopOwner.TRAINING):
            return self.after_stop()  # the watcher is saving for this rank
        result = self.save(step, stage) if self.begin(step) else None
        return self.finish(step, result)

    def begin(self, step: int) -> bool:
        """Enter the stop at `step`: the save in flight is waited for. True when a just-in-time
        save is still needed (the step is not durable yet); the adapter makes it (`save`, or a
        write of its own through `ckpt.session.commit`), then calls `finish`."""
        self.claim(StopOwner.TRAINING)
        self.stopped = True
        log.warning("kubeckpt: stop requested; saving a just-in-time checkpoint at step %d", step)
        self.ckpt.session.wait()
        return self.ckpt.durable_step != step

    def save(self, step: int, stage: Callable[[], Staged]) -> SaveResult | None:
        """The just-in-time save itself: to the persistent tier (the local one when it is the
        only tier), blocking until durable."""
        return self.ckpt.save(
            step,
            stage,
            persistent=True,
            local=self.ckpt.persistent is None,
            reason=REASON_JIT,
            blocking=True,
        )

    def finish(self, step: int, result: SaveResult | None) -> bool:
        """Answer preStop after the stop's save (`result`; None: the step was durable already)."""
        ckpt = self.ckpt
        where: str | None
        if result is None and ckpt.durable_step == step:
            ok, where, error = True, ckpt.durable_location, None
        else:
            ok = result is not None and result.ok
            where = next(iter(result.locations.values()), None) if result and result.ok else None
            error = result.error if result else "no checkpoint tier configured"
        if result is None and step == 0 and ckpt.durable_step is None:
            ok, where, error = True, None, None  # no step completed: nothing to lose
        if ok:
            ckpt.progress.checkpoint_was_jit()
        detail: dict[str, Any] = {"step": step}
        if where:
            detail["checkpoint"] = where
        if error:
            detail["error"] = error
        self.triggers.acknowledge(ok, detail)
        self._ok = ok
        self._finished.set()
        if self.owner is StopOwner.TRAINING:
            # The per-step agreement has one round in flight: finish it now that the
            # checkpoint is durable and the answer given (a rank still away joins it later).
            self._last_round(rejoin=False)
        return ok

    def after_stop(self) -> bool:
        """The training thread, once stopped: wait for the watcher's save (if it is saving) and
        take part in the per-step agreement's last round, as every rank does; the stop's result."""
        if self.owner is StopOwner.WATCHER:
            self._finished.wait()
            self._last_round(rejoin=True)
        return self._ok

    def _last_round(self, *, rejoin: bool) -> None:
        try:
            self.ckpt.end_agreement(rejoin=rejoin)
        except Exception as e:  # a rank gone: the checkpoint is saved, the answer given
            log.warning("kubeckpt: the last per-step agreement failed: %s", e)

    # ------------------------------------------------------------------ away from a boundary

    def at_boundary(self, step: int) -> None:
        """The training thread is at the boundary of `step` (after it, or restored to it: loading
        may run the optimizer's step once to create its state, as DCP does: no update)."""
        self.boundary_step, self.boundary_time, self._updated = step, time.monotonic(), False

    @property
    def completed_step(self) -> int:
        """The last optimizer step this rank completed (a boundary, or one past it)."""
        return self.boundary_step + (1 if self._updated else 0)

    def mark_update(self) -> None:
        """The adapter's post-optimizer-step hook: an update happened since the last boundary."""
        self._updated = True

    def before_update(self) -> None:
        """The adapter's pre-optimizer-step hook: wait while a stop holds updates."""
        hold = self._hold_at
        if hold is not None and self.completed_step >= hold:
            self._released.wait()

    def hold_updates(self, at: int) -> None:
        """No optimizer step past step `at` until `release_updates` (the watcher's save)."""
        self._released.clear()
        self._hold_at = at

    def release_updates(self) -> None:
        self._hold_at = None
        self._released.set()

    def start_watcher(self, ctl: Agreement, stage: Callable[[int], Staged] | None) -> None:
        """Honour stops away from step boundaries (watcher.py); `stage(step)` copies the state
        from the watcher thread while optimizer steps are held (None: the watcher only spreads
        a stop to every rank's next boundary). Every rank calls it."""
        if not (self.ckpt.enabled and self.triggers.enabled) or self.watcher is not None:
            return
        self.watcher = StopWatcher(
            self,
            ctl,
            stage,
            takeover_after=self._takeover_after,
            reach_timeout=min(10.0, _stop_budget() / 4),
            poll=self.ckpt.config.stop_poll_seconds,
        )
        self.watcher.start()

    def save_from_watcher(self, step: int, stage: Callable[[], Staged]) -> bool:
        """The watcher's save of `step` (the last completed optimizer step, updates held)."""
        result = None
        if self.ckpt.durable_step != step and step > 0:
            result = self.save(step, stage)
        self.stopped = True
        ok = self.finish(step, result)
        # The training thread is away and may never come back before the kubelet's SIGKILL:
        # the last record goes out now, with this checkpoint in it.
        self.ckpt.progress.write_final()
        return ok

    def fail(self, step: int, why: str) -> None:
        """A stop that could not save (the framework could not reach a step boundary in time):
        counted and said in the progress record and the preStop answer."""
        self.stopped = True
        self.ckpt.count_failure(step, why, prefix="stop: ")
        self.triggers.acknowledge(False, {"step": step, "error": why})

    def _takeover_after(self) -> float:
        config = self.ckpt.config
        if config.stop_takeover_seconds is not None:
            return config.stop_takeover_seconds
        # A few step times (a slow step is not a stuck one), within a quarter of the budget so
        # the save still has the rest.
        steps = 3 * (self.ckpt.timer.step_seconds or 0.0)
        return min(max(2.0, steps), max(1.0, _stop_budget() / 4))

    # ------------------------------------------------------------------ the hand-over to the exit

    def close(self, final: Callable[[], ProgressRecord | None] | None = None) -> None:
        """Every rank's watcher ends, the checkpointer finishes (the last per-step round, the save
        in flight); then the signals are given back (ignored after a stop: the kubelet's SIGTERM
        that follows preStop must not turn the clean exit into a 143), a request that came too
        late is answered, and the final record written (`final` None: the stop wrote it).
        Idempotent; the process then exits with `exit_code`."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.watcher is not None:
                self.watcher.close(timeout=10 * self.watcher.poll + 5)
            self.ckpt.close()
        finally:
            self.triggers.close(stopped=self.stopped)
            record = final() if final is not None else None
            if record is not None and self.ckpt.progress.enabled:
                self.ckpt.write_progress(record, final=True)


def _stop_budget() -> float:
    """Seconds a stop may take before the kubelet's SIGKILL (what the webhook injected)."""
    raw = os.environ.get(TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "")
    try:
        return max(1.0, float(raw))
    except ValueError:
        return 30.0
