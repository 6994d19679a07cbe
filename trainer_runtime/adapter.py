"""The loop every framework adapter runs, written once (the torch and JAX CheckpointManagers).

    mgr.restore(...)              the newest complete checkpoint every rank can load
    mgr.step_end(step, ...)       per optimizer step: the stop, a due save, the progress record
    mgr.close()                   the hand-over to the exit; then `sys.exit(mgr.exit_code)`

A manager keeps a `Checkpointer` (protocol/: schedule, save, restore) in `_ckpt` and the rank's
`JitStop` (stop/) in `_stop`, and adds only what is its framework's: its member and agreements,
`_stage` (a `Staged` copy of its state), its `Loader`, `_scalars` (loss and learning rate as plain
numbers) and `_manifest_extra`. The HF callback, whose loop is the Trainer's, shares
`before_update` and the stop package with them.
"""

from __future__ import annotations

import atexit
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, Self

from .config import Config
from .contract import ProgressRecord
from .progress_writer import ProgressWriter
from .protocol import Agreement, Checkpointer, Loader, Member, Report, Restored
from .protocol.resume import same_world_size
from .protocol.resume_outcome import ResumeRefused
from .protocol.session import SaveResult, SaveSession, Staged
from .stop import JitStop, StopOwner
from .storage import LocalTier, Tier

log = logging.getLogger("trainer_runtime.stop")


class _Copying(Protocol):
    def wait_before_update(self) -> None: ...


def before_update(stop: JitStop, session: SaveSession, staged: _Copying | None) -> None:
    """An optimizer's pre-step hook: wait while a stop holds updates (the watcher saves), then
    for the copies the save in flight still reads (counted as the training thread's stall)."""
    stop.before_update()
    if staged is not None and session.busy:
        t0 = time.monotonic()
        staged.wait_before_update()
        session.add_stall(time.monotonic() - t0)


class AdapterBase:
    """Base of a framework's CheckpointManager: the shared loop and the protocol's state."""

    config: Config
    enabled: bool
    _ckpt: Checkpointer
    _stop: JitStop

    def _start(
        self,
        config: Config,
        *,
        framework: str,
        me: Member,
        comm: Agreement,
        io: Agreement,
        total_steps: int | None,
        total_epochs: int | None,
    ) -> None:
        """The checkpointer and the stop (whose SIGTERM handler this installs), before the
        framework's own set-up; it then starts the watcher (`self._stop.start_watcher`)."""
        self.config = config
        self.enabled = config.enabled
        self._ckpt = Checkpointer(
            config,
            framework=framework,
            comm=comm,
            io=io,
            me=me,
            total_steps=total_steps,
            total_epochs=total_epochs,
            manifest_extra=self._manifest_extra,
        )
        self._stop = JitStop(self._ckpt)
        self.epoch = 0
        self.step = 0
        self._closed = False
        self._hooks: list[Any] = []  # the framework's hook handles, removed on close
        self._last_report: tuple[Any, Any, Any] = (None, None, None)
        self._told_stopped = False  # step_end has returned True: the loop should have ended
        self._warned_stopped = False
        # A script that never calls close() (an exception, sys.exit) still leaves its final record
        # for `kubectl`; nothing more happens at exit, where other ranks may already be gone.
        atexit.register(self._at_exit)

    # ------------------------------------------------------------------ the framework's part

    def _manifest_extra(self, tier: Tier, reports: list[Report]) -> dict[str, Any]:
        raise NotImplementedError

    def _scalars(self, loss: Any, learning_rate: Any) -> tuple[Any, Any]:
        """The loss and learning rate as plain numbers (read only when a record is written)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the loop

    def _restore(self, loader: Loader, *, needs: str) -> Restored | None:
        """The newest complete checkpoint every rank can load; a local copy counts where this
        rank's own file `needs` is in it."""
        own = same_world_size(self._ckpt.me, needs=needs)
        try:
            restored = self._ckpt.restore(loader, local_usable=own)
        except ResumeRefused:
            # Every rank refuses alike: end the stop watcher (every rank's, at the same round) and
            # the groups before the process exits, or it can abort at exit (SIGABRT, 134: see
            # torch/agreement.py's Collectives.destroy) instead of exiting with the refusal's code.
            self._close(together=True)
            raise
        if restored is not None:
            self._stop.at_boundary(restored.step)
            self.step = restored.step
        return restored

    def _step_end(
        self,
        step: int,
        stage: Callable[[bool], Staged],
        *,
        epoch: int | None,
        loss: Any,
        learning_rate: Any,
        metrics: Mapping[str, Any] | None,
        end_of_epoch: bool,
    ) -> bool:
        """The per-step loop; `stage(blocking)` copies the state at `step`. True: the loop ends
        (a just-in-time checkpoint was taken, or its attempt ended)."""
        if self.stopped:
            self._stop.after_stop()
            self._tell_stopped()
            return True
        self.step = step
        if epoch is not None:
            self.epoch = epoch
        self._ckpt.epoch = self.epoch
        self._last_report = (loss, learning_rate, metrics)
        decision = self._stop.decide(step, end_of_epoch=end_of_epoch)
        if decision.stop:
            if self._stop.owner is not StopOwner.WATCHER:
                self._stop.save_at(step, lambda: stage(True))
            self._write_progress(step, loss, learning_rate, metrics, final=True)
            self._tell_stopped()
            return True
        if decision.persistent or decision.local:
            blocking = not self.config.async_save
            self._ckpt.save(
                step,
                lambda: stage(blocking),
                persistent=decision.persistent,
                local=decision.local,
                blocking=blocking,
            )
        if self.progress.due(step):
            self._write_progress(step, loss, learning_rate, metrics)
        return False

    def _tell_stopped(self) -> None:
        """`step_end` returns True. Called again after that, the loop ignored it and trains on
        after the stop with nothing saved any more: said once, with what to do."""
        if self._told_stopped and not self._warned_stopped:
            self._warned_stopped = True
            log.warning(
                "kubeckpt: step_end() was called again after it returned True: training was "
                "stopped for preemption at step %d, and nothing after it is saved. End the loop "
                "when step_end() returns True and exit with `mgr.exit_code` (%d)",
                self.step,
                self.exit_code,
            )
        self._told_stopped = True

    def _save(self, step: int, stage: Callable[[], Staged], *, blocking: bool) -> SaveResult | None:
        """A save the script asks for, to the persistent tier (every rank at the same step)."""
        if self.stopped:
            return None  # nothing is saved after the stop's checkpoint
        return self._ckpt.save(step, stage, blocking=blocking)

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable or has failed; its result."""
        return self._ckpt.session.wait()

    # ------------------------------------------------------------------ progress and shutdown

    def _write_progress(
        self,
        step: int,
        loss: Any,
        learning_rate: Any,
        metrics: Mapping[str, Any] | None,
        *,
        final: bool = False,
    ) -> None:
        if not self.progress.enabled:
            return
        record = self._record(step, (loss, learning_rate, metrics), final=final)
        self._ckpt.write_progress(record, final=final)

    def _record(
        self, step: int, report: tuple[Any, Any, Mapping[str, Any] | None], *, final: bool = False
    ) -> ProgressRecord:
        """The progress record of `step` from the loop's (loss, learning rate, metrics)."""
        loss, learning_rate, metrics = report
        try:
            loss, learning_rate = self._scalars(loss, learning_rate)
        except Exception as e:
            if not final:
                raise  # in the loop, the training script learns of it as from its own read
            # The last loss is a device value whose computation failed (a peer gone in the
            # middle of a collective): the final record goes without it rather than not at all.
            log.warning("kubeckpt: the last loss cannot be read (%s); final progress without it", e)
            loss = learning_rate = None
        timer = self._ckpt.timer
        return self.progress.build(
            step,
            epoch=self.epoch,
            loss=loss,
            learning_rate=learning_rate,
            step_seconds=timer.step_seconds,
            eta_seconds=timer.eta_seconds(step, self.progress.total_steps),
            metrics=dict(metrics or {}),
        )

    def close(self) -> None:
        """Wait for the save in flight, write the final progress record and the termination
        message, remove hooks and signal handlers (JitStop.close), and end the agreement groups
        with the other ranks. Idempotent. Called while an exception propagates (`with` or
        `finally` on a rank that failed alone), the groups are left as they are: ending them
        waits for every rank, and the others may still be training."""
        self._close(together=sys.exc_info()[0] is None)

    def _close(self, *, together: bool) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        try:
            self._stop.close(final=None if self.stopped else self._final_record)
        finally:
            for hook in self._hooks:
                hook.remove()
            if together:
                self._end_groups(self._stop.watcher_ended)

    def _end_groups(self, watcher_ended: bool) -> None:
        """The framework's agreement groups, once closed (torch destroys its gloo groups)."""

    def _final_record(self) -> ProgressRecord | None:
        if not self.progress.enabled:
            return None
        return self._record(self.step, self._last_report, final=True)

    def _at_exit(self) -> None:
        if not self._closed and not self.stopped:
            self._write_progress(self.step, *self._last_report, final=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the state, read-only

    @property
    def persistent(self) -> Tier | None:
        return self._ckpt.persistent

    @property
    def local(self) -> LocalTier | None:
        return self._ckpt.local

    @property
    def progress(self) -> ProgressWriter:
        return self._ckpt.progress

    @property
    def stopped(self) -> bool:
        return self._stop.stopped

    @property
    def last_result(self) -> SaveResult | None:
        return self._ckpt.last_result

    @property
    def last_error(self) -> str | None:
        return self._ckpt.last_error

    @property
    def failed_saves(self) -> int:
        return self._ckpt.failed_saves

    @property
    def resumed_from(self) -> str | None:
        """ "checkpoint-<step>" this process resumed from (`generation-<N>/checkpoint-<step>`
        in a later generation of CHECKPOINT_URI)."""
        return self._ckpt.resumed_name

    @property
    def resumed_tier(self) -> str | None:
        """ "local", "persistent", or "local (peer copy)": the local tier, where a node's part came
        back from its ring successor's copy (peer_copy/)."""
        return self._ckpt.resumed_tier

    @property
    def exit_code(self) -> int:
        """What the training process should exit with (stop/jit.py): 0, or 143 after a
        just-in-time stop (`return mgr.exit_code` at the end of the script)."""
        return self._stop.exit_code
