"""The save protocol every framework adapter drives (torch, the HF Trainer, JAX).

    ckpt = Checkpointer(config, framework="pytorch", comm=..., io=..., me=Member(...))
    restored = ckpt.restore(loader)              # the newest complete checkpoint, agreed
    ...each optimizer step...
    d = ckpt.decide(step, epoch=epoch)           # stop / persistent / local, agreed (pipelined)
    if d.stop: ckpt.stop(step, stage)            # a just-in-time save, then the loop ends
    elif d.persistent or d.local: ckpt.save(step, stage, persistent=..., local=...)
    ckpt.close(final_record)

The adapter supplies only what is framework-specific: an `Agreement` over its collectives (two:
one for the training thread's per-step question, one for the writer thread), a `stage` callable
that copies its state and returns a `Staged` (prepare + write this rank's files), and a `Loader`.
Everything else (the schedule, one save in flight, the commit over each tier, retention, resume
across tiers, failure accounting, the preStop answer, progress) is here, once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..contract import (
    MANIFEST_REASON,
    REASON_JIT,
    REASON_PERIODIC,
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
    Manifest,
    ManifestFile,
    ProgressRecord,
    checkpoint_dir_name,
    format_rfc3339,
)
from ..progress_writer import ProgressWriter
from ..storage import LocalTier, Tier, persistent_tier
from ..timing import Schedule, StepTimer
from .agreement import Agreement
from .commit import Member, Report
from .resume import Loader, Restored, candidates, remove_incomplete, restore, same_world_size
from .session import SaveResult, SaveSession, Staged
from .stops import StopControl
from .watcher import StopWatcher

log = logging.getLogger("trainer_runtime.protocol")

# (tier, reports) -> extra manifest keys, e.g. {"kubeckpt": {"format": "dcp"}}
ManifestExtra = Callable[[Tier, list[Report]], dict[str, Any]]


@dataclass
class StepDecision:
    stop: bool = False
    persistent: bool = False
    local: bool = False


class Checkpointer:
    def __init__(
        self,
        config: Config,
        *,
        framework: str,
        comm: Agreement,
        io: Agreement,
        me: Member,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        manifest_extra: ManifestExtra | None = None,
    ) -> None:
        self.config = config
        s = config.settings
        self.framework = framework
        self.me = me
        self.comm = comm
        self.io = io
        self.enabled = config.enabled
        self._agreement = comm.pipelined()
        self._manifest_extra = manifest_extra

        self.persistent: Tier | None = None
        self.local: LocalTier | None = None
        if self.enabled:
            assert s.checkpoint_uri is not None  # RuntimeSettings guarantees it when enabled
            self.persistent = persistent_tier(s.checkpoint_uri, config.resolved_staging_dir())
            if s.local_dir:
                self.local = LocalTier(s.local_dir, "local")

        self.progress = ProgressWriter(
            s.progress_file,
            enabled=me.rank == 0,
            every=s.progress_update_frequency,
            total_steps=total_steps,
            total_epochs=total_epochs,
            checkpointing_enabled=self.enabled,
            termination_log=config.termination_log,
        )
        jit = self.enabled and s.jit
        self.stops = StopControl(s.control_dir if jit else None, answers=me.local_rank == 0)
        self.stops.install()
        self.schedule = Schedule(s, local_enabled=self.local is not None)
        self.timer = StepTimer()
        self.session = SaveSession(
            io, me, manifest=self.manifest, keep=self._keep, on_result=self._on_result
        )

        self.step = 0
        self.epoch = 0
        self.stopped = False
        self.closed = False
        self.resumed: Restored | None = None
        self.last_result: SaveResult | None = None
        self.last_error: str | None = None
        self.failed_saves = 0
        # Retention of the persistent tier (the HF adapter adopts the Trainer's save_total_limit).
        self.keep_persistent = s.max_checkpoints
        self.durable_step: int | None = None  # newest step known saved in the persistent tier
        self._durable_location: str | None = None
        # Where the training thread is (watcher.py): its last step boundary, and whether an
        # optimizer step has completed since (the adapter's post-step hook says so).
        self.boundary_step = 0
        self.boundary_time = time.monotonic()
        self._updated = False
        # Who saves the stop on this rank: "training" (at a boundary) or "watcher" (away from one).
        self.stop_owner: str | None = None
        self._stop_lock = threading.Lock()
        self._stop_finished = threading.Event()
        self._stop_ok = False
        self._pipeline_done = False
        self._hold_at: int | None = None
        self._released = threading.Event()
        self._released.set()
        self.watcher: StopWatcher | None = None

    # ------------------------------------------------------------------ restore

    def restore(
        self,
        loader: Loader,
        *,
        local_usable: Callable[[Tier, int], bool] | None = None,
        keep_fetched: bool = False,
    ) -> Restored | None:
        """Load the newest complete checkpoint every rank can load (None: start from scratch)."""
        if not self.enabled or not self.config.settings.resume:
            return None
        remove_incomplete(self.io, self.me, self.persistent, self.local)
        found = candidates(
            self.io,
            self.me,
            self.persistent,
            self.local,
            local_usable or same_world_size(self.me),
        )
        restored = restore(
            self.io,
            self.me,
            found,
            loader,
            checksums=self.config.should_verify_checksums,
            keep_fetched=keep_fetched,
        )
        if restored is None:
            log.info("kubeckpt: no usable checkpoint, starting from step 0")
            return None
        self.resumed = restored
        self.step = restored.step
        # Loading may run the optimizer's step once to create its state (DCP does): no update.
        self.boundary_step, self.boundary_time = restored.step, time.monotonic()
        self._updated = False
        self.epoch = restored.manifest.epoch
        name = checkpoint_dir_name(restored.step)
        self.progress.resumed(name, restored.location, restored.manifest.time)
        if restored.tier is self.persistent:
            self.durable_step = restored.step
            self._durable_location = restored.location
        self.schedule.restart_interval()
        log.info("kubeckpt: resumed from %s (%s tier)", restored.location, restored.tier.name)
        return restored

    # ------------------------------------------------------------------ per step

    def decide(
        self,
        step: int,
        *,
        end_of_epoch: bool = False,
        also_persistent: bool = False,
    ) -> StepDecision:
        """At the end of an optimizer step: stop, save, or go on, the same on every rank.

        The stop question is pipelined (answered one step later, never waited for); a due save
        is decided at once where every rank computes the same answer (step counts, epochs, the
        framework's own schedule: `also_persistent`) and by rank 0's clock for the time strategy.
        """
        self.step = step
        self.timer.observe(step)
        self.boundary_step, self.boundary_time, self._updated = step, time.monotonic(), False
        if self.stop_owner == "watcher":
            self.after_stop()  # parked here until the watcher's save is durable
            return StepDecision(stop=True)
        self.session.reap()
        if not self.enabled or self.stopped:
            return StepDecision(stop=self.stopped)
        decision = self.schedule.decide(step, end_of_epoch=end_of_epoch)
        timed = self.config.settings.checkpoint_strategy == "time"
        # The time strategy reads the clock: only rank 0's reading counts, or ranks disagree.
        vote = timed and decision.persistent and self.me.rank == 0
        if vote:
            self.schedule.restart_interval()  # one vote per interval, not one per step
        agreed = self._agreement.exchange([int(self.stops.pending()), int(vote)])
        stop = bool(agreed and agreed[0])
        persistent = bool(agreed and agreed[1]) if timed else decision.persistent
        return StepDecision(
            stop=stop, persistent=persistent or also_persistent, local=decision.local
        )

    def tiers(self, *, persistent: bool, local: bool) -> list[Tier]:
        out: list[Tier] = []
        if local and self.local is not None:
            out.append(self.local)
        if persistent and self.persistent is not None:
            out.append(self.persistent)
        return out

    def save(
        self,
        step: int,
        stage: Callable[[], Staged],
        *,
        persistent: bool = True,
        local: bool = False,
        reason: str = REASON_PERIODIC,
        blocking: bool = False,
        epoch: int | None = None,
    ) -> SaveResult | None:
        """Stage now (the training thread waits for that only) and persist on the writer thread.
        Every rank must call it at the same step. With `blocking`, the result."""
        if self.stopped and reason != REASON_JIT:
            return None  # nothing is saved after the stop's checkpoint
        self.session.wait()  # a new save waits for the previous one
        tiers = self.tiers(persistent=persistent, local=local)
        if not tiers:
            return None
        started = time.monotonic()
        staged = stage()
        stall = time.monotonic() - started
        if persistent:
            self.schedule.restart_interval()
        return self.session.submit(
            staged,
            step,
            self.epoch if epoch is None else epoch,
            tiers,
            reason=reason,
            started=started,
            stall=stall,
            blocking=blocking,
        )

    def stop(self, step: int, stage: Callable[[], Staged]) -> bool:
        """The just-in-time save at `step`, then the preStop answer; True when it is durable."""
        if not self.claim_stop("training"):
            return self.after_stop()  # the watcher is saving for this rank
        result = self.save_stop(step, stage) if self.stop_requested(step) else None
        return self.stop_done(step, result)

    def save_stop(self, step: int, stage: Callable[[], Staged]) -> SaveResult | None:
        """The just-in-time save itself: to the persistent tier (the local one when it is the
        only tier), blocking until durable."""
        return self.save(
            step,
            stage,
            persistent=True,
            local=self.persistent is None,
            reason=REASON_JIT,
            blocking=True,
        )

    def stop_requested(self, step: int) -> bool:
        """Enter the stop at `step`: the save in flight is waited for. True when a just-in-time
        save is still needed (the step is not durable yet); the adapter makes it
        (`save(..., reason=REASON_JIT, blocking=True)`, or a write of its own through
        `session.commit`), then calls `stop_done`."""
        self.claim_stop("training")
        self.stopped = True
        log.warning("kubeckpt: stop requested; saving a just-in-time checkpoint at step %d", step)
        self.session.wait()
        return self.durable_step != step

    def claim_stop(self, who: str) -> bool:
        """Make `who` the one actor that saves this rank's stop; False if another already is."""
        with self._stop_lock:
            if self.stop_owner is None:
                self.stop_owner = who
            return self.stop_owner == who

    def stop_from_watcher(self, step: int, stage: Callable[[], Staged]) -> bool:
        """The watcher's save of `step` (the last completed optimizer step, updates held)."""
        result = None
        if self.durable_step != step and step > 0:
            result = self.save_stop(step, stage)
        self.stopped = True
        ok = self.stop_done(step, result)
        # The training thread is away and may never come back before the kubelet's SIGKILL:
        # the last record goes out now, with this checkpoint in it.
        self.progress.write_final()
        return ok

    def after_stop(self) -> bool:
        """The training thread, once stopped: wait for the watcher's save (if it is saving) and
        take part in the per-step agreement's last round, as every rank does; the stop's result."""
        if self.stop_owner == "watcher":
            self._stop_finished.wait()
            if not self._pipeline_done:
                self._pipeline_done = True
                try:
                    self._agreement.exchange([1, 0])
                    self._agreement.collect()
                except Exception as e:  # a rank gone: the checkpoint is saved, the answer given
                    log.warning("kubeckpt: the last per-step agreement failed: %s", e)
        return self._stop_ok

    def stop_done(self, step: int, result: SaveResult | None) -> bool:
        """Answer preStop after the stop's save (`result`; None: the step was durable already)."""
        where: str | None
        if result is None and self.durable_step == step:
            ok, where, error = True, self._durable_location, None
        else:
            ok = result is not None and result.ok
            where = next(iter(result.locations.values()), None) if result and result.ok else None
            error = result.error if result else "no checkpoint tier configured"
        if result is None and step == 0 and self.durable_step is None:
            ok, where, error = True, None, None  # no step completed: nothing to lose
        if ok:
            self.progress.checkpoint_was_jit()
        detail: dict[str, Any] = {"step": step}
        if where:
            detail["checkpoint"] = where
        if error:
            detail["error"] = error
        self.stops.acknowledge(ok, detail)
        self._finish_stop(ok)
        return ok

    def _finish_stop(self, ok: bool) -> None:
        self._stop_ok = ok
        self._stop_finished.set()
        if self.stop_owner == "training" and not self._pipeline_done:
            # The per-step agreement has one round in flight: finish it now that the
            # checkpoint is durable and the answer given (a rank still away joins it later).
            self._pipeline_done = True
            try:
                self._agreement.collect()
            except Exception as e:
                log.warning("kubeckpt: the last per-step agreement failed: %s", e)

    # ------------------------------------------------------------------ stops away from a boundary

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
        if not (self.enabled and self.stops.enabled) or self.watcher is not None:
            return
        self.watcher = StopWatcher(
            self,
            ctl,
            stage,
            takeover_after=self._takeover_after,
            reach_timeout=min(10.0, self._stop_budget() / 4),
            poll=self.config.stop_poll_seconds,
        )
        self.watcher.start()

    def _stop_budget(self) -> float:
        """Seconds a stop may take before the kubelet's SIGKILL (what the webhook injected)."""
        raw = os.environ.get(TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "")
        try:
            return max(1.0, float(raw))
        except ValueError:
            return 30.0

    def _takeover_after(self) -> float:
        if self.config.stop_takeover_seconds is not None:
            return self.config.stop_takeover_seconds
        # A few step times (a slow step is not a stuck one), within a quarter of the budget so
        # the save still has the rest.
        steps = 3 * (self.timer.step_seconds or 0.0)
        return min(max(2.0, steps), max(1.0, self._stop_budget() / 4))

    def record(self, result: SaveResult) -> None:
        """Account for a save the adapter made itself through `session.commit(...)`."""
        self._on_result(result)

    def stop_failed(self, step: int, why: str) -> None:
        """A stop that could not save (the framework could not reach a step boundary in time):
        counted and said in the progress record and the preStop answer."""
        self.stopped = True
        self.failed_saves += 1
        self.last_error = why
        self.progress.checkpoint_failed(step, f"stop: {why}")
        self.stops.acknowledge(False, {"step": step, "error": why})

    # ------------------------------------------------------------------ results

    def _keep(self, tier: Tier) -> int:
        return self.config.local_keep if tier.name == "local" else max(1, self.keep_persistent)

    def manifest(
        self,
        tier: Tier,
        step: int,
        epoch: int,
        reports: list[Report],
        reason: str = REASON_PERIODIC,
    ) -> Manifest:
        """The manifest of a save: every file the ranks reported, with its size and checksum,
        and why the checkpoint was written (`kubeckpt checkpoints` lists it)."""
        files: dict[str, ManifestFile] = {}
        for report in reports:
            for path, size, sha in report.files:
                files[path] = ManifestFile(path=path, size=size, sha256=sha)
        extra = self._manifest_extra(tier, reports) if self._manifest_extra else {}
        extra[MANIFEST_REASON] = reason
        return Manifest(
            step=step,
            epoch=epoch,
            time=format_rfc3339(),
            world_size=self.me.world_size,
            framework=self.framework,
            tier=tier.name,
            files=[files[p] for p in sorted(files)],
            extra=extra,
        )

    def _on_result(self, result: SaveResult) -> None:
        self.last_result = result
        if not result.ok:
            self.failed_saves += 1
            self.last_error = result.error
            log.error("kubeckpt: checkpoint at step %d failed: %s", result.step, result.error)
            self.progress.checkpoint_failed(result.step, result.error or "unknown error")
            return
        if "persistent" in result.locations:
            self.durable_step = result.step
            self._durable_location = result.locations["persistent"]
            self.progress.checkpoint_saved(
                result.locations["persistent"],
                save_seconds=result.save_seconds,
                stall_seconds=result.stall_seconds,
                reason=result.reason,
            )
        if "local" in result.locations:
            self.progress.local_checkpoint_saved(result.locations["local"])

    # ------------------------------------------------------------------ progress and shutdown

    def write_progress(self, record: ProgressRecord, *, final: bool = False) -> None:
        if final:
            self.progress.write_final(record)
        else:
            self.progress.write(record)

    def close(self, final: Callable[[], ProgressRecord | None] | None = None) -> None:
        """Wait for the save in flight, give the signals back, answer a request that came too
        late, and write the final record (unless a stop wrote it). Idempotent."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.watcher is not None:
                self.watcher.close(timeout=10 * self.watcher.poll + 5)
            if not self._pipeline_done:
                self._agreement.collect()
            self.session.shutdown()
        finally:
            self.stops.close(stopped=self.stopped)
            record = final() if final is not None else None
            if record is not None and self.progress.enabled:
                self.progress.write_final(record)
