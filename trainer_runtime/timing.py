"""Step timing (smoothed seconds per step, ETA) and the checkpoint schedule (stdlib only)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .contract import RuntimeSettings


class StepTimer:
    """Exponentially smoothed seconds per optimizer step.

    The first interval after (re)start is skipped: it holds start-up and compilation time, which
    would make the ETA of a freshly resumed job wildly pessimistic.
    """

    def __init__(self, alpha: float = 0.1, clock=time.monotonic) -> None:
        self.alpha = alpha
        self._clock = clock
        self._last_step: int | None = None
        self._last_time: float | None = None
        self._observed = 0
        self.step_seconds: float | None = None

    def observe(self, step: int) -> None:
        now = self._clock()
        if self._last_step is not None and self._last_time is not None and step > self._last_step:
            per_step = (now - self._last_time) / (step - self._last_step)
            self._observed += 1
            if self._observed > 1:
                if self.step_seconds is None:
                    self.step_seconds = per_step
                else:
                    self.step_seconds += self.alpha * (per_step - self.step_seconds)
        self._last_step, self._last_time = step, now

    def eta_seconds(self, step: int, total_steps: int | None) -> float | None:
        if total_steps is None or self.step_seconds is None:
            return None
        return max(0, total_steps - step) * self.step_seconds


@dataclass
class Decision:
    persistent: bool = False
    local: bool = False


class Schedule:
    """When periodic checkpoints are due, from CHECKPOINT_STRATEGY / _INTERVAL / _SAVE_STEPS and
    CHECKPOINT_LOCAL_PERIOD. The time strategy reads the clock, so in a multi-rank job only rank 0's
    answer may count (the manager agrees on it); the other strategies are the same on every rank.
    """

    def __init__(self, settings: RuntimeSettings, *, local_enabled: bool, clock=time.monotonic):
        self.settings = settings
        self.local_enabled = local_enabled
        self._clock = clock
        self._last_persistent = clock()

    def restart_interval(self) -> None:
        """Count the interval from now (after a restore or a save)."""
        self._last_persistent = self._clock()

    def decide(self, step: int, *, end_of_epoch: bool = False) -> Decision:
        s = self.settings
        if not s.checkpoint_enabled or step <= 0:
            return Decision()
        if s.checkpoint_strategy == "steps":
            persistent = step % (s.checkpoint_save_steps or 1) == 0
        elif s.checkpoint_strategy == "epoch":
            persistent = end_of_epoch
        else:
            persistent = self._clock() - self._last_persistent >= s.checkpoint_interval
        local = self.local_enabled and step % s.local_period == 0
        return Decision(persistent=persistent, local=local)
