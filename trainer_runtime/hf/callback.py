"""A TrainerCallback that puts the HF Trainer on kubeckpt's checkpoint protocol.

What it does, and how:

- Progress: rank 0 writes $TRAINING_PROGRESS_FILE every PROGRESS_UPDATE_FREQUENCY steps (step,
  epoch, loss and learning rate from the Trainer's logs, eval metrics, smoothed step time, ETA).
- Saves: it drives `control.should_save` from CHECKPOINT_STRATEGY (time / steps / epoch) and also
  adopts the saves the Trainer's own `save_strategy` asks for. The Trainer's `_save_checkpoint`
  writes the files (HF layout, so plain `Trainer.train(resume_from_checkpoint=...)` reads them);
  this callback makes the save atomic around it: before it, rank 0 creates `checkpoint-<step>/`
  holding only the sentinel; after it (`on_save`, every rank, then a barrier), rank 0 fsyncs every
  file, writes `manifest.json` and removes the sentinel.
- Async saves (`kubeckpt_trainer`, single process and DDP): the Trainer's `_save_checkpoint` is
  replaced by one that stages a CPU copy of what it would write (async_save.py) and persists it on
  a save thread; training waits only for the copy. A save is finalized (manifest, sentinel removed,
  retention) only once every rank's files are written and fsynced: each rank's "still writing /
  failed" flags ride on the per-step agreement, so no extra collective is needed; a new save, a
  JIT stop and the end of training wait for the one in flight. A failed write (ENOSPC, ...) is
  logged and reported in the progress record, the checkpoint is never finalized (rank 0 removes
  it), and training goes on. FSDP, DeepSpeed, subclasses with saves of their own and
  KUBECKPT_ASYNC_SAVE=false keep the synchronous path below (async_save.async_unsupported).
- JIT: SIGTERM or the preStop request file sets a flag; every step the ranks agree (all_reduce MAX
  on their own gloo group) whether any rank wants to stop, so all save at the same step and then
  stop with `control.should_training_stop`. The preStop request is acknowledged after the save,
  which is durable and finalized before `train()` returns.
- Retention: the callback owns it (the Trainer's `save_total_limit` is taken over and set to None,
  because the Trainer's rotation would count incomplete checkpoints and could delete complete
  ones); it keeps `save_total_limit` if the user set one, else CHECKPOINT_MAX_CHECKPOINTS.
- Resume: `resume_checkpoint(root)` removes incomplete checkpoints and returns the newest complete,
  verified one; `kubeckpt_trainer(trainer)` passes it to `train()` when CHECKPOINT_RESUME is on.

What blocks: with async saves, creating the directory with its sentinel (a barrier) and the CPU
copy. On the synchronous path, the Trainer's own `_save_checkpoint` plus our fsync and manifest.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .. import handover, layout
from ..config import Config
from ..contract import (
    PREEMPTED_EXIT_CODE,
    REASON_JIT,
    REASON_PERIODIC,
    build_manifest,
    checkpoint_dir_name,
    read_manifest,
)
from ..fsutil import fsync_dir, fsync_file, remove_tree
from ..progress_writer import ProgressWriter
from ..timing import Schedule, StepTimer
from ..triggers import RequestFile, SignalTrigger
from .kubeflow import guard_kubeflow_callbacks

log = logging.getLogger(__name__)

_METRIC_KEYS = {
    "eval_loss": "validationLoss",
    "eval_accuracy": "validationAccuracy",
    "accuracy": "accuracy",
}


def _rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover - transformers needs torch here
        pass
    return 0, 1


@dataclass
class _Pending:
    """An async save between staging and finalization."""

    step: int
    path: Path
    epoch: int
    started: float  # monotonic, when the save began (the directory with its sentinel)
    stall: float  # seconds training waited for it
    future: Future  # the persist: None, or this rank's error
    reason: str = REASON_PERIODIC  # or REASON_JIT


def resume_checkpoint(root: str | os.PathLike[str], config: Config | None = None) -> str | None:
    """The newest complete, verified `checkpoint-<step>` under `root` (a local path), or None.

    Rank 0 (or a single process) first removes incomplete checkpoints and interrupted deletions.
    A complete checkpoint that fails verification is skipped (and left for inspection).
    """
    rank, _ = _rank_world()
    # Every rank waits alike (each then scans by itself): a pod being replaced may still be
    # writing a newer checkpoint, which the clean-up below would otherwise delete.
    handover.wait_for_saves_in_flight(root)
    if rank == 0:
        layout.remove_incomplete(root)
    checksums = config.should_verify_checksums if config is not None else True
    for entry in reversed(layout.scan(root)):
        if not entry.complete:
            continue
        path = Path(root, checkpoint_dir_name(entry.step))
        _, problems = layout.verify_checkpoint(path, checksums=checksums)
        if not problems:
            return str(path)
        log.warning("kubeckpt: skipping checkpoint %s: %s", path, "; ".join(problems[:3]))
    return None


class KubeckptCallback(TrainerCallback):
    def __init__(self, config: Config) -> None:
        self.config = config
        s = config.settings
        self.root = s.checkpoint_uri.removeprefix("file://") if s.checkpoint_uri else None
        if config.is_remote:
            raise NotImplementedError(
                "kubeckpt HF integration: only a local or mounted CHECKPOINT_URI so far"
            )
        self.keep = s.max_checkpoints
        self.schedule = Schedule(s, local_enabled=False)
        self.timer = StepTimer()
        self.signal = SignalTrigger()
        self.request = RequestFile(s.control_dir)
        self.progress: ProgressWriter | None = None
        self.comm: Any = None
        self.rank, self.world_size = 0, 1
        self.stopped = False  # a JIT save happened and training was stopped
        self._hf_trainer: Any = None  # set by kubeckpt_trainer
        self.resumed_from: str | None = None
        self._saving_step: int | None = None
        self._saved_step: int | None = None
        self._stop_after_save = False
        self._last_logs: dict[str, Any] = {}
        self._metrics: dict[str, Any] = {}
        self._state: Any = None
        # Async saves (set up by kubeckpt_trainer): at most one between staging and finalization.
        self.async_save = False
        self.stager: Any = None
        self._trainer: Any = None
        self._warmed = False
        self._executor: ThreadPoolExecutor | None = None
        self._pending: _Pending | None = None
        self._finalizing: tuple[_Pending, Future] | None = None  # rank 0
        self.failed_saves = 0
        self.last_error: str | None = None

    @classmethod
    def from_env(cls, **overrides: Any) -> KubeckptCallback:
        return cls(Config.from_env(**overrides))

    # --- set-up and tear-down ---

    def adopt(self, args: Any) -> None:
        """Point the Trainer's output at CHECKPOINT_URI and take over its retention."""
        if self.root is None:
            return
        args.output_dir = self.root
        if args.save_total_limit:
            self.keep = max(1, int(args.save_total_limit))
            args.save_total_limit = None

    def on_init_end(self, args, state, control, **kwargs):
        if self.config.enabled:
            self.adopt(args)

    def on_train_begin(self, args, state, control, **kwargs):
        from ..torch.agreement import Collectives

        if self._hf_trainer is not None:  # a KubeflowCallback added after kubeckpt_trainer()
            guard_kubeflow_callbacks(self._hf_trainer, lambda: self.stopped)

        self.comm = Collectives.create()
        self.rank, self.world_size = self.comm.rank, self.comm.world_size
        self._state = state
        s = self.config.settings
        self.progress = ProgressWriter(
            s.progress_file,
            enabled=self.rank == 0,
            every=s.progress_update_frequency,
            total_steps=state.max_steps or None,
            total_epochs=int(args.num_train_epochs) if args.max_steps <= 0 else None,
            checkpointing_enabled=self.config.enabled,
            termination_log=self.config.termination_log,
        )
        if self.resumed_from:
            try:  # the resumed checkpoint is the latest one until this run saves
                saved_time = read_manifest(self.resumed_from).time
            except (OSError, ValueError):
                saved_time = None
            name = os.path.basename(self.resumed_from)
            self.progress.resumed(name, self.resumed_from, saved_time)
        if self.config.enabled and s.jit:
            self.signal.install()
        self.schedule.restart_interval()

    @property
    def exit_code(self) -> int:
        """What the script should exit with after `trainer.train()`: 0, or PREEMPTED_EXIT_CODE
        (143) after a just-in-time stop, so that the job controller restarts the job instead of
        counting the preempted pod a success (see trainer_runtime.contract.PREEMPTED_EXIT_CODE)."""
        return PREEMPTED_EXIT_CODE if self.stopped else 0

    def on_train_end(self, args, state, control, **kwargs):
        self._drain()  # the last save is durable and finalized before train() returns
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        # After a JIT stop a later SIGTERM (the kubelet's, after preStop) must not turn the clean
        # exit into 143: the handler stays, only logging.
        self.signal.uninstall(stopping=self.stopped)
        self._close_group()
        if self.progress is not None:
            self.progress.write_final(self._record(state))

    def _close_group(self) -> None:
        """Destroy our gloo group once every rank is done with it. Left to interpreter exit, a
        rank whose peer has already exited can abort there ("terminate called without an active
        exception", SIGABRT), failing a job that trained and saved correctly."""
        if self.comm is None or not self.comm.distributed:
            return
        import torch.distributed as dist

        try:
            self.comm.barrier()
            dist.destroy_process_group(self.comm.group)
        except Exception as e:  # tear-down must not fail a finished run
            log.warning("kubeckpt: cannot destroy the agreement group: %s", e)
        self.comm = None

    # --- progress ---

    def on_log(self, args, state, control, logs=None, **kwargs):
        for key, value in (logs or {}).items():
            if key in ("loss", "learning_rate"):
                self._last_logs[key] = value
            elif key in _METRIC_KEYS:
                self._metrics[_METRIC_KEYS[key]] = value

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.on_log(args, state, control, logs=metrics)

    def _record(self, state):
        step = state.global_step
        return self.progress.build(
            step,
            epoch=int(state.epoch) if state.epoch is not None else None,
            loss=self._last_logs.get("loss"),
            learning_rate=self._last_logs.get("learning_rate"),
            step_seconds=self.timer.step_seconds,
            eta_seconds=self.timer.eta_seconds(step, state.max_steps or None),
            metrics=self._metrics,
        )

    # --- save decisions ---

    def _decide(self, state, control, *, end_of_epoch: bool) -> None:
        if not self.config.enabled:
            return
        step = state.global_step
        if step == self._saved_step:
            # Saved at this step already (on_step_end, then on_epoch_end at an epoch's last step):
            # a second save would first delete the complete checkpoint, or write into it.
            control.should_save = False
            return
        want_stop = self.config.settings.jit and (self.signal.fired or self.request.pending())
        periodic = self.schedule.decide(step, end_of_epoch=end_of_epoch).persistent
        if self.config.settings.checkpoint_strategy == "time" and self.rank != 0:
            periodic = False  # rank 0's clock decides
        hf_save = bool(control.should_save)  # the Trainer's own save_strategy
        if self._saving_step == step:
            return  # already decided at this step (on_step_end, then on_epoch_end)
        busy, failed = self._pending_flags()
        stop, save, busy, failed = self.comm.all_max(
            [int(want_stop), int(periodic or hf_save), busy, failed]
        )
        if self._pending is not None and not busy:
            self._conclude(ok=not failed)  # every rank's files are written and fsynced
        if stop:
            self._stop_after_save = True
            control.should_training_stop = True
        if stop or save:
            control.should_save = True
            self._begin(step)

    def _begin(self, step: int) -> None:
        """The directory with only the sentinel, before the Trainer writes into it."""
        self._drain()  # one save in flight at most
        started = _now()
        if self.rank == 0:
            layout.begin(self.root, step)
        self.comm.barrier()  # no rank writes its files before the sentinel is there
        self._saving_step = step
        self._save_started = started

    def on_step_end(self, args, state, control, **kwargs):
        self.timer.observe(state.global_step)
        if self.stager is not None and not self._warmed:
            # After the first optimizer step, when Adam & co. have their state.
            self._warmed = True
            try:
                self.stager.warm(self._trainer)
            except Exception as e:  # only an optimization: the first save allocates instead
                log.warning("kubeckpt: cannot pre-allocate staging buffers: %s", e)
        if self._finalizing is not None:
            self._collect_finalize(wait=False)
        self._decide(state, control, end_of_epoch=False)
        if self.progress is not None and self.progress.due(state.global_step):
            self.progress.write(self._record(state))

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.config.settings.checkpoint_strategy == "epoch" or control.should_save:
            self._decide(state, control, end_of_epoch=True)

    # --- async saves ---

    def stages(self, step: int) -> bool:
        """Whether the save the Trainer starts now is ours to stage (else its own runs)."""
        return self.async_save and self.config.enabled and self._saving_step == step

    def submit(self, snapshot: Any, step: int, epoch: int, error: str | None = None) -> None:
        """Hand a staged snapshot to the save thread (called right after staging). A rank whose
        staging failed passes `error` instead: it still has a save in flight, one that failed, so
        every rank keeps taking part in the same agreements."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubeckpt-save")
        if error is None:
            future = self._executor.submit(_persist, snapshot)
        else:
            future = Future()
            future.set_result(error)
        self._pending = _Pending(
            step=step,
            path=Path(self.root, checkpoint_dir_name(step)),
            epoch=epoch,
            started=self._save_started,
            stall=_now() - self._save_started,
            future=future,
            reason=REASON_JIT if self._stop_after_save else REASON_PERIODIC,
        )
        self._saving_step = None
        self._saved_step = step
        self.schedule.restart_interval()

    def _pending_flags(self) -> tuple[int, int]:
        """(still writing, failed) for this rank's save in flight."""
        if self._pending is None:
            return 0, 0
        if not self._pending.future.done():
            return 1, 0
        return 0, int(self._pending.future.result() is not None)

    def _conclude(self, ok: bool) -> bool:
        """Every rank agreed the save in flight is written (ok) or failed somewhere (not ok)."""
        pending, self._pending = self._pending, None
        assert pending is not None and self._executor is not None
        if not ok:
            error = pending.future.result() or "another rank could not write its files"
            self._failed(pending.step, error)
        if self.rank == 0:
            work = self._finalize if ok else _discard
            self._finalizing = (pending, self._executor.submit(work, pending))
        return ok

    def _finalize(self, pending: _Pending) -> str | None:
        """Rank 0, on the save thread: manifest (hashing every file), sentinel, retention."""
        try:
            manifest = build_manifest(
                pending.path,
                step=pending.step,
                epoch=pending.epoch,
                world_size=self.world_size,
                framework="transformers",
                tier="persistent",
            )
            layout.finalize(pending.path, manifest)
            fsync_dir(self.root)
            layout.retain(self.root, self.keep)
        except Exception as e:  # reported at the next step, never raised into training
            log.error("kubeckpt: cannot complete checkpoint %s: %s", pending.path, e)
            return f"{type(e).__name__}: {e}"
        return None

    def _collect_finalize(self, *, wait: bool) -> bool | None:
        """Rank 0: record the finalization once it is done; its success, None if still running."""
        assert self._finalizing is not None
        pending, future = self._finalizing
        if not wait and not future.done():
            return None
        self._finalizing = None
        error = future.result()
        if error is not None:
            if not error.startswith("discarded"):
                self._failed(pending.step, error)
            return False
        if self.progress is not None:
            seconds = _now() - pending.started
            self.progress.checkpoint_saved(
                str(pending.path),
                save_seconds=seconds,
                stall_seconds=pending.stall,
                reason=pending.reason,
            )
            if self._state is not None:
                self.progress.write(self._record(self._state))
        return True

    def _drain(self) -> bool | None:
        """Wait for the save in flight (every rank must call this at the same point): persisted,
        agreed, and on rank 0 finalized. Its success (rank 0: finalized), None if there was none."""
        result = None
        if self._pending is not None:
            own_error = self._pending.future.result()
            result = self._conclude(self.comm.all_ok(own_error is None))
        if self._finalizing is not None:
            result = self._collect_finalize(wait=True)
        return result

    def _failed(self, step: int, error: str) -> None:
        self.failed_saves += 1
        self.last_error = error
        log.error("kubeckpt: checkpoint at step %d failed: %s", step, error)
        if self.progress is not None:
            c = self.progress.checkpointing
            c.extra["failedSaves"] = self.failed_saves
            c.extra["lastError"] = error[:300]

    # --- after the Trainer's _save_checkpoint (or our staging) ---

    def on_save(self, args, state, control, **kwargs):
        if not self.config.enabled:
            return
        if self._pending is not None and self._pending.step == state.global_step:
            if self._stop_after_save:  # JIT: durable and finalized before training returns
                step, path = self._pending.step, self._pending.path
                ok = bool(self._drain())
                self.stopped = True
                if self.rank == 0 and self.request.pending():
                    self.request.acknowledge(ok, {"step": step, "path": str(path)})
            return
        if self._saving_step != state.global_step:
            return
        step = state.global_step
        path = Path(self.root, checkpoint_dir_name(step))
        ok = True
        try:
            for dirpath, _, filenames in os.walk(path):
                for name in filenames:
                    fsync_file(Path(dirpath, name))
        except OSError as e:
            log.error("kubeckpt: cannot fsync %s: %s", path, e)
            ok = False
        ok = self.comm.all_ok(ok)  # every rank's files are written (and fsynced) by now
        if ok and self.rank == 0:
            try:
                manifest = build_manifest(
                    path,
                    step=step,
                    epoch=int(state.epoch or 0),
                    world_size=self.world_size,
                    framework="transformers",
                    tier="persistent",
                )
                layout.finalize(path, manifest)
                fsync_dir(self.root)
                layout.retain(self.root, self.keep)
            except (OSError, ValueError) as e:
                log.error("kubeckpt: cannot complete checkpoint %s: %s", path, e)
                ok = False
        ok = self.comm.all_ok(ok)
        self._saving_step = None
        self._saved_step = step if ok else None
        self.schedule.restart_interval()
        if ok and self.progress is not None:
            seconds = _now() - self._save_started
            self.progress.checkpoint_saved(
                str(path),
                save_seconds=seconds,
                stall_seconds=seconds,
                reason=REASON_JIT if self._stop_after_save else REASON_PERIODIC,
            )
            self.progress.write(self._record(state))
        if self._stop_after_save:
            self.stopped = True
            if self.rank == 0 and self.request.pending():
                self.request.acknowledge(ok, {"step": step, "path": str(path)})


def _now() -> float:
    return time.monotonic()


def _persist(snapshot: Any) -> str | None:
    """On the save thread: write this rank's files; None, or the error (never raised)."""
    try:
        snapshot.persist()
    except Exception as e:  # ENOSPC, EIO, a serialization error: the save fails, training goes on
        log.error("kubeckpt: cannot write checkpoint files in %s: %s", snapshot.output_dir, e)
        return f"{type(e).__name__}: {e}"
    return None


def _discard(pending: _Pending) -> str:
    """Rank 0, on the save thread: a save some rank could not write is removed (never complete)."""
    try:
        remove_tree(pending.path)
    except OSError as e:
        log.warning("kubeckpt: cannot remove failed checkpoint %s: %s", pending.path, e)
    return "discarded"


def kubeckpt_trainer(trainer: Any, config: Config | None = None) -> Any:
    """Attach kubeckpt to a built Trainer, in one line: `trainer = kubeckpt_trainer(Trainer(...))`.

    Adds the callback (from the environment unless `config` is given), points `output_dir` at
    CHECKPOINT_URI, and makes `trainer.train()` resume from the newest complete checkpoint when
    CHECKPOINT_RESUME is on and no `resume_from_checkpoint` was passed.

    Idempotent: a trainer that already has kubeckpt attached (zero-code mode attaches it from
    `Trainer.__init__`, and the script may call this again) is returned unchanged, so there is
    never a second callback or a twice-wrapped `train()`.
    """
    if getattr(trainer, "kubeckpt", None) is not None:
        return trainer
    callback = KubeckptCallback(config or Config.from_env())
    trainer.add_callback(callback)
    callback.adopt(trainer.args)
    trainer.kubeckpt = callback
    callback._hf_trainer = trainer
    guard_kubeflow_callbacks(trainer, lambda: callback.stopped)
    if callback.config.enabled:
        _install_async_save(trainer, callback)
    train = trainer.train

    def train_with_resume(resume_from_checkpoint=None, *args: Any, **kwargs: Any):
        cfg = callback.config
        if resume_from_checkpoint is None and cfg.enabled and cfg.settings.resume:
            resume_from_checkpoint = resume_checkpoint(callback.root, cfg)
            callback.resumed_from = resume_from_checkpoint
        return train(resume_from_checkpoint, *args, **kwargs)

    trainer.train = train_with_resume
    return trainer


def _install_async_save(trainer: Any, callback: KubeckptCallback) -> None:
    """Replace the Trainer's `_save_checkpoint` with stage-then-persist where that is supported."""
    from .async_save import Stager, async_unsupported, stage

    reason = "KUBECKPT_ASYNC_SAVE=false" if not callback.config.async_save else None
    reason = reason or async_unsupported(trainer)
    if reason is not None:
        log.info("kubeckpt: synchronous checkpoint saves (%s)", reason)
        return
    callback.async_save = True
    callback.stager = Stager()
    callback._trainer = trainer
    own_save = trainer._save_checkpoint

    def save_checkpoint(model: Any, trial: Any = None) -> None:
        step = trainer.state.global_step
        if trial is not None or not callback.stages(step):
            return own_save(model, trial)  # not one of our saves: the Trainer's own, as before
        epoch = int(trainer.state.epoch or 0)
        try:
            snapshot = stage(trainer, callback.stager, step)
        except Exception as e:  # this save fails (on every rank, by agreement); training goes on
            log.error("kubeckpt: cannot stage the checkpoint at step %d: %s", step, e)
            callback.submit(None, step, epoch, error=f"staging: {type(e).__name__}: {e}")
            return
        callback.submit(snapshot, step, epoch)

    trainer._save_checkpoint = save_checkpoint
