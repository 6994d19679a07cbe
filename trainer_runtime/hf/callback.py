"""A TrainerCallback that puts the HF Trainer on kubeckpt's save protocol (`protocol/`).

It is the protocol's HF adapter, as trainer_runtime.torch.CheckpointManager is its PyTorch one:
the same schedule, agreement, commit, tiers, retention, resume, failure accounting and preStop
answer. What is HF's own:

- Progress: rank 0 writes $TRAINING_PROGRESS_FILE every PROGRESS_UPDATE_FREQUENCY steps (step,
  epoch, loss and learning rate from the Trainer's logs, eval metrics, smoothed step time, ETA).
- Saves: it drives `control.should_save` from CHECKPOINT_STRATEGY (time / steps / epoch) and also
  adopts the saves the Trainer's own `save_strategy` asks for. Files are in the Trainer's layout,
  so plain `Trainer.train(resume_from_checkpoint=...)` reads them.
- Async saves (`kubeckpt_trainer`, single process and DDP): the Trainer's `_save_checkpoint` is
  replaced by one that stages a CPU copy of what it would write (async_save.py); the protocol's
  writer thread writes it to each tier (the persistent one in CHECKPOINT_URI, a path or s3://, and
  the ramdisk in CHECKPOINT_LOCAL_DIR every CHECKPOINT_LOCAL_PERIOD steps on a single node),
  reports every rank's files and commits. Training waits only for the copy.
- Synchronous saves (FSDP, DeepSpeed, subclasses with saves of their own, KUBECKPT_ASYNC_SAVE=false,
  or the callback added without `kubeckpt_trainer`): the Trainer writes the files itself; the
  protocol's commit is split around its save: the directory with only the sentinel before it
  (`on_step_end`), the reports and the manifest after it (`on_save`). Persistent tier only.
- JIT: SIGTERM or the preStop request; the ranks agree on it with the pipelined per-step
  agreement, save at the same step, and stop with `control.should_training_stop`. The preStop
  request is answered once the checkpoint is durable and committed, before `train()` returns.
  Then, in zero-code mode (`exit_on_stop`), the process ends with the preemption exit code where
  the Trainer's training loop returns (stop/process_end.py): the script's code after `train()`
  assumes training finished and never runs. In library mode `train()` returns, with a warning
  that the script should exit now (`trainer.kubeckpt.stopped`, `exit_code`).
- Retention: the callback owns it (the Trainer's `save_total_limit` is taken over and set to None,
  because the Trainer's rotation would count incomplete checkpoints and could delete complete
  ones); it keeps `save_total_limit` if the user set one, else CHECKPOINT_MAX_CHECKPOINTS.
- Resume: `kubeckpt_trainer(trainer)` makes `train()` resume from the newest complete checkpoint
  across tiers (downloaded first for s3://) when CHECKPOINT_RESUME is on; `resume_checkpoint(root)`
  does the same for a local or mounted directory, for scripts that call `train()` themselves.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from .. import handover, layout
from ..adapter import before_update
from ..config import Config
from ..contract import (
    INCOMPLETE_SENTINEL,
    MANIFEST_FILE,
    MANIFEST_REASON,
    REASON_JIT,
    REASON_PERIODIC,
    Manifest,
    RuntimeSettings,
    UnsupportedFormatVersion,
    build_manifest,
    parse_generation_dir_name,
    read_manifest,
)
from ..fsutil import fsync_dir, fsync_file
from ..generations import newest_first
from ..protocol import Checkpointer, Report, SaveResult, TierCommit
from ..protocol.resume import same_world_size
from ..protocol.resume_outcome import (
    MAX_REASONS,
    UNSUPPORTED,
    UNVERIFIED,
    Action,
    Rejected,
    ResumeOutcome,
    ResumeRefused,
    decide_resume,
)
from ..staging_budget import staging_budget
from ..stop import JitStop, StopOwner, exit_code
from ..stop.process_end import end_process
from ..storage import LocalTier, Tier, persistent_tier
from ..torch.agreement import destroy_groups, groups, member
from ..torch.dcp import hash_files
from .kubeflow import guard_kubeflow_callbacks
from .world_size import check_resume

if TYPE_CHECKING:
    from .async_save import StagingPlan

log = logging.getLogger(__name__)

FRAMEWORK = "transformers"

_METRIC_KEYS = {
    "eval_loss": "validationLoss",
    "eval_accuracy": "validationAccuracy",
    "accuracy": "accuracy",
}
_RNG_FILE = re.compile(r"rng_state_(\d+)\.pth")
_DCP_SHARD = re.compile(r"__(\d+)_\d+\.distcp")  # FSDP's sharded save, one file per rank


def resume_checkpoint(root: str | os.PathLike[str], config: Config | None = None) -> str | None:
    """The newest complete, verified `checkpoint-<step>` under `root` (a local path), by commit
    order across its generations (generations.py), or None.

    Rank 0 (or a single process) first removes incomplete checkpoints and interrupted deletions.
    A complete checkpoint that fails verification is skipped (and left for inspection). When
    checkpoints exist but none verifies, ResumeRefused ends the process (exit 65) unless
    CHECKPOINT_ON_UNVERIFIABLE is StartFresh; one of an unknown format version ends it (78).
    """
    rank = member().rank
    # Every rank waits alike (each then scans by itself): a pod being replaced may still be
    # writing a newer checkpoint, which the clean-up below would otherwise delete.
    handover.wait_for_saves_in_flight(root)
    if rank == 0:
        layout.remove_incomplete(root)
    checksums = config.should_verify_checksums if config is not None else True
    rejected: list[Rejected] = []
    for entry in newest_first(layout.with_sequences(root, layout.scan(root))):
        path = layout.checkpoint_path(root, entry.step, entry.generation)
        try:
            _, problems = layout.verify_checkpoint(path, checksums=checksums)
        except UnsupportedFormatVersion as e:
            rejected.append(Rejected(str(path), UNSUPPORTED, (str(e),)))
            break
        if not problems:
            return str(path)
        log.warning("kubeckpt: skipping checkpoint %s: %s", path, "; ".join(problems[:3]))
        rejected.append(Rejected(str(path), UNVERIFIED, tuple(problems[:MAX_REASONS])))
    # None verifies: the same decision as the managed restore (stop unless the policy allows a
    # fresh start), so a script that calls train() itself does not train from step 0 unnoticed.
    settings = config.settings if config is not None else RuntimeSettings.from_env()
    decision = decide_resume(ResumeOutcome(None, tuple(rejected)), settings.on_unverifiable)
    if decision.action is Action.FAIL:
        log.error("kubeckpt: %s", decision.message)
        raise ResumeRefused(decision)
    if decision.message:
        log.warning("kubeckpt: %s", decision.message)
    return None


def _generation_of(checkpoint: object, root: str | None) -> int | None:
    """The generation of `root` a checkpoint path given to `train()` is in (None: not ours)."""
    if root is None or not isinstance(checkpoint, str | os.PathLike):
        return None
    parent = Path(checkpoint).parent
    if parent == Path(root):
        return 0
    n = parse_generation_dir_name(parent.name)
    return n if n is not None and parent.parent == Path(root) else None


def _owned(name: str, rank: int) -> bool:
    """Whether `name` in an HF checkpoint is this rank's to report: every rank writes its own
    `rng_state_<rank>.pth`; everything else is written by the main process (rank 0)."""
    if name in (INCOMPLETE_SENTINEL, MANIFEST_FILE):
        return False
    base = name.rsplit("/", 1)[-1]
    match = _RNG_FILE.fullmatch(base) or _DCP_SHARD.fullmatch(base)
    if match is not None:
        return int(match.group(1)) == rank
    return rank == 0


class _HFSave:
    """One staged HF save: the protocol's `Staged` (async path)."""

    def __init__(self, snapshot: Any, rank: int, error: str | None = None) -> None:
        self.snapshot = snapshot
        self.rank = rank
        self.error = error

    @property
    def staging_note(self) -> str | None:
        """Why the save was not staged whole (SaveResult.staging_note)."""
        return None if self.snapshot is None else self.snapshot.staging_note

    def prepare(self) -> None:
        if self.error is not None:
            raise RuntimeError(self.error)
        self.snapshot.wait_copies()

    def finished(self) -> None:
        """The writer is done, written or not: a save not staged whole frees training."""
        if self.snapshot is not None and self.snapshot.released is not None:
            self.snapshot.released.set()

    def wait_before_update(self) -> None:
        """The next optimizer step must not change what is still being copied, nor, in a save
        not staged whole, what is still being written from training memory."""
        if self.snapshot is not None:
            try:
                self.snapshot.wait_copies()
            except RuntimeError:
                pass  # reported by prepare() on the writer thread
            if self.snapshot.released is not None:
                self.snapshot.released.wait()

    def write(self, tier: Tier, directory: Path) -> list[Any]:
        self.snapshot.output_dir = str(directory)
        names = self.snapshot.persist()
        return hash_files(directory, [n for n in names if _owned(n, self.rank)])


class _HFLoader:
    """The protocol's `Loader` for HF: the Trainer loads in `train()`; this only checks."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def prepare(self, path: Path, manifest: Manifest, tier: Tier) -> None:
        names = {f.path for f in manifest.files}
        if "trainer_state.json" not in names:
            raise ValueError("not an HF Trainer checkpoint (no trainer_state.json)")

    def apply(self, prepared: Any, path: Path, manifest: Manifest, tier: Tier) -> None:
        return None


class KubeckptCallback(TrainerCallback):
    def __init__(self, config: Config) -> None:
        self.config = config
        s = config.settings
        self.root = s.checkpoint_uri.removeprefix("file://") if s.checkpoint_uri else None
        if config.enabled and s.checkpoint_uri:
            # An unusable CHECKPOINT_URI (an unknown scheme, s3:// without s3fs) fails here, where
            # zero-code mode can still train without kubeckpt, not in the middle of train().
            persistent_tier(s.checkpoint_uri, config.resolved_staging_dir())
        self.keep = s.max_checkpoints
        self.ckpt: Checkpointer | None = None
        self.stop: JitStop | None = None  # the just-in-time stop over `ckpt`
        self.comm: Any = None
        self.io: Any = None
        self.ctl: Any = None
        self._hooks: list[Any] = []
        self._in_flight: _HFSave | None = None  # the save whose copies the next update waits for
        self.rank, self.world_size = 0, 1
        self.stopped = False  # a JIT save happened and training was stopped
        # Zero-code mode: the process ends once train() is done after a stop (ended_by_stop).
        self.exit_on_stop = False
        self._warned_returned = False
        self._hf_trainer: Any = None  # set by kubeckpt_trainer
        self.resumed_from: str | None = None
        # A download to drop once training runs: (tier, step, generation).
        self._fetched: tuple[Tier, int, int] | None = None
        # The save decided at this step: (step, persistent, local, reason); the sync path's
        # commit in progress between on_step_end and on_save.
        self._due: tuple[int, bool, bool, str] | None = None
        self._inline: tuple[TierCommit, float, str] | None = None
        self._saved_step: int | None = None
        self._last_logs: dict[str, Any] = {}
        self._metrics: dict[str, Any] = {}
        self._state: Any = None
        self._seen_result: SaveResult | None = None
        # Async saves (set up by kubeckpt_trainer).
        self.async_save = False
        self.stager: Any = None
        self._trainer: Any = None
        self._warmed = False
        # Saves this run that did not fit the staging budget and held training (hf/async_save.py)
        self.saves_over_budget = 0
        self._last_staging: Any = None  # the last save's Staging, to warn when it changes

    @classmethod
    def from_env(cls, **overrides: Any) -> KubeckptCallback:
        return cls(Config.from_env(**overrides))

    # --- the protocol's state ---

    @property
    def failed_saves(self) -> int:
        return self.ckpt.failed_saves if self.ckpt is not None else self._failed[0]

    @property
    def last_error(self) -> str | None:
        return self.ckpt.last_error if self.ckpt is not None else self._failed[1]

    _failed: tuple[int, str | None] = (0, None)  # kept from the last train() once torn down

    @property
    def stopping(self) -> bool:
        """A stop's save is due (it blocks: nothing to overlap with)."""
        return self._due is not None and self._due[3] == REASON_JIT

    @property
    def progress(self) -> Any:
        return self.ckpt.progress if self.ckpt is not None else None

    # --- set-up and tear-down ---

    def adopt(self, args: Any) -> None:
        """Point the Trainer's output at CHECKPOINT_URI and take over its retention."""
        if self.root is None:
            return
        if self.config.is_remote:
            # s3://: the Trainer writes into the upload staging directory, whence it is published.
            staging = Path(self.config.resolved_staging_dir(), "upload")
            args.output_dir = str(staging)
        else:
            args.output_dir = self.root
        if args.save_total_limit:
            self.keep = max(1, int(args.save_total_limit))
            args.save_total_limit = None

    def on_init_end(self, args, state, control, **kwargs):
        if self.config.enabled:
            self.adopt(args)

    def _ensure(self) -> tuple[Checkpointer, JitStop]:
        """The protocol and the stop, once torch.distributed is set up (every rank calls this in
        the same order: it creates three process groups)."""
        if self.ckpt is not None and self.stop is not None:
            return self.ckpt, self.stop
        from ..torch import workers

        enabled = self.config.enabled
        self.comm, self.io, self.ctl = groups(enabled)  # the ctl group is the stop watcher's
        if enabled and self.config.settings.jit:
            workers.install()  # DataLoader workers outlive the stop signal
        me = member()
        self.rank, self.world_size = me.rank, me.world_size
        self.ckpt = Checkpointer(
            self.config, framework=FRAMEWORK, comm=self.comm, io=self.io, me=me
        )
        self.stop = JitStop(self.ckpt)
        self.ckpt.keep_persistent = self.keep
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        if self.ckpt.local is not None and (local_world != self.world_size or not self.async_save):
            # Only rank 0 writes the model: another node's ramdisk would hold its RNG files only.
            log.warning(
                "kubeckpt: the local tier (CHECKPOINT_LOCAL_DIR) needs async saves on one node "
                "with the HF Trainer; using the persistent tier only"
            )
            self.ckpt.local = None
            self.ckpt.schedule.local_enabled = False
        return self.ckpt, self.stop

    def restore(self) -> str | None:
        """The newest complete checkpoint every rank can use, across tiers (a download for
        s3://, kept until training has started): the path to pass to `train()`."""
        ckpt, stop = self._ensure()
        restored = ckpt.restore(
            _HFLoader(self.world_size),
            local_usable=same_world_size(ckpt.me, needs="trainer_state.json"),
            keep_fetched=True,
        )
        if restored is None:
            return None
        stop.at_boundary(restored.step)
        step, generation = restored.step, restored.directory_generation
        tier = restored.tier
        fetched = tier.copy_per_node
        if fetched or restored.path != tier.fetch_dir(step, generation):
            self._fetched = (restored.tier, step, generation)
        return str(restored.path)

    def on_train_begin(self, args, state, control, **kwargs):
        if self._hf_trainer is not None:  # a KubeflowCallback added after kubeckpt_trainer()
            guard_kubeflow_callbacks(self._hf_trainer, lambda: self.stopped)
        ckpt, stop = self._ensure()
        # The generation this run writes, where `restore` did not decide it (resume off, or a
        # checkpoint the script passed to train() itself: the Trainer has loaded its state by
        # now, so a step past 0 says it resumed; from which generation, where the path is
        # known); the Trainer's own saves go there too.
        resumed = bool(self.resumed_from) or state.global_step > 0
        ckpt.plan(resumed=resumed, restored=_generation_of(self.resumed_from, self.root))
        if isinstance(ckpt.persistent, LocalTier) and self.config.enabled:
            args.output_dir = str(ckpt.persistent.directory)
        self._state = state
        ckpt.progress.total_steps = state.max_steps or None
        ckpt.progress.total_epochs = int(args.num_train_epochs) if args.max_steps <= 0 else None
        if self.resumed_from and ckpt.resumed is None:
            # train(resume_from_checkpoint=...) given by the script: the latest until we save.
            try:
                saved_time = read_manifest(self.resumed_from).time
            except (OSError, ValueError):
                saved_time = None
            name = os.path.basename(self.resumed_from)
            ckpt.progress.resumed(name, self.resumed_from, saved_time)
        stop.triggers.install()
        ckpt.schedule.restart_interval()
        optimizer = kwargs.get("optimizer")
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch one
        if inner is not None and hasattr(inner, "register_step_pre_hook"):
            self._hooks = [
                inner.register_step_pre_hook(lambda *_: self._before_update()),
                inner.register_step_post_hook(lambda *_: stop.mark_update()),
            ]
        # Away from a step boundary (a long evaluation), the watcher saves from its own thread:
        # only with async staging, which copies without the training thread's collectives.
        stop.start_watcher(self.ctl, self._takeover_stage if self.async_save else None)

    @property
    def exit_code(self) -> int:
        """What the script should exit with after `trainer.train()` (stop/jit.py): 0, or 143
        after a just-in-time stop, so that the job controller restarts the job instead of
        counting the preempted pod a success."""
        return exit_code(self.stopped)

    def ended_by_stop(self) -> None:
        """The Trainer's training has returned. After a just-in-time stop (saved or not), zero-code
        mode ends the process here with `exit_code`, on every rank (each returns from the same
        agreed stop). Nothing happens after a run that finished, or in library mode."""
        if self.stopped and self.exit_on_stop:
            end_process(self.exit_code)

    def _warn_returning(self, step: int) -> None:
        """Library mode: `train()` returns after a stop, and the script's next line is its own.
        Said once, as it returns (nothing of ours sees that code before it runs), with what to do;
        also for a callback added by hand, which has no `train()` of ours around it."""
        if self._warned_returned:
            return
        self._warned_returned = True
        log.warning(
            "kubeckpt: train() returns because training was stopped for preemption at step %d; "
            "training did not finish. Exit now, before any code that assumes a finished model: "
            "`if trainer.kubeckpt.stopped: sys.exit(trainer.kubeckpt.exit_code)` (exit code %d)",
            step,
            self.exit_code,
        )

    def on_train_end(self, args, state, control, **kwargs):
        ckpt, stop = self.ckpt, self.stop
        if ckpt is None or stop is None:
            return
        self._release_fetched()
        # The last save is durable and committed before train() returns. After a JIT stop a later
        # SIGTERM (the kubelet's, after preStop) must not turn the clean exit into 143.
        stop.close(final=lambda: self._record(state))
        self.stopped = self.stopped or stop.stopped
        self._failed = (ckpt.failed_saves, ckpt.last_error)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._close_groups(stop.watcher_ended)
        self.ckpt = self.stop = None
        if self.stopped and not self.exit_on_stop:
            self._warn_returning(state.global_step)

    def _close_groups(self, watcher_ended: bool) -> None:
        # A watcher still in a collective on its group (a rank gone): leave that one.
        ctl = self.ctl if watcher_ended else None
        destroy_groups((self.comm, self.io, ctl))
        self.comm = self.io = self.ctl = None

    def _release_fetched(self) -> None:
        if self._fetched is not None:
            tier, step, generation = self._fetched
            self._fetched = None
            tier.release_fetched(step, generation)

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
        assert self.ckpt is not None
        step = state.global_step
        timer = self.ckpt.timer
        return self.ckpt.progress.build(
            step,
            epoch=int(state.epoch) if state.epoch is not None else None,
            loss=self._last_logs.get("loss"),
            learning_rate=self._last_logs.get("learning_rate"),
            step_seconds=timer.step_seconds,
            eta_seconds=timer.eta_seconds(step, state.max_steps or None),
            metrics=self._metrics,
        )

    def _refresh_progress(self, state) -> None:
        """Write the record now when a save has just ended (kubectl sees it without waiting)."""
        ckpt = self.ckpt
        if ckpt is not None and ckpt.last_result is not self._seen_result:
            self._seen_result = ckpt.last_result
            if ckpt.progress.enabled:
                ckpt.progress.write(self._record(state))

    # --- save decisions ---

    def _decide(self, state, control, *, end_of_epoch: bool) -> None:
        ckpt, stop = self.ckpt, self.stop
        if ckpt is None or stop is None:
            return
        step = state.global_step
        if not self.config.enabled or self.stopped:
            ckpt.timer.observe(step)
            control.should_save = False if self.stopped else control.should_save
            return
        if step == self._saved_step or (self._due is not None and self._due[0] == step):
            # Decided at this step already (on_step_end, then on_epoch_end at an epoch's last
            # step): a second save would delete the complete checkpoint, or write into it.
            control.should_save = bool(self._due and self._due[0] == step)
            return
        hf_save = bool(control.should_save)  # the Trainer's own save_strategy
        ckpt.epoch = int(state.epoch or 0)
        decision = stop.decide(step, end_of_epoch=end_of_epoch, also_persistent=hf_save)
        self._refresh_progress(state)
        if decision.stop and stop.owner is StopOwner.WATCHER:  # saved away from a boundary
            self.stopped = True
            control.should_training_stop = True
            control.should_save = False
            return
        if decision.stop:
            control.should_training_stop = True
            if stop.begin(step):
                control.should_save = True
                self._due = (step, True, ckpt.persistent is None, REASON_JIT)
            else:  # this step is durable already: only the answer is left
                self.stopped = True
                control.should_save = False
                stop.finish(step, None)
        elif decision.persistent or decision.local:
            control.should_save = True
            self._due = (step, decision.persistent, decision.local, REASON_PERIODIC)
        else:
            control.should_save = False
        if self._due is not None and self._due[0] == step and not self.stages(step):
            self._begin_inline(step, state)
            control.should_save = self._inline is not None

    def on_step_end(self, args, state, control, **kwargs):
        if self.stager is not None and not self._warmed:
            # After the first optimizer step, when Adam & co. have their state.
            self._warmed = True
            try:
                if self.staging_plan().note() is None:  # else no full-size buffers
                    self.stager.warm(self._trainer)
            except Exception as e:  # only an optimization: the first save allocates instead
                log.warning("kubeckpt: cannot pre-allocate staging buffers: %s", e)
        if self._fetched is not None:
            self._release_fetched()  # the Trainer has read the downloaded checkpoint by now
        self._decide(state, control, end_of_epoch=False)
        progress = self.progress
        if progress is not None and progress.due(state.global_step):
            progress.write(self._record(state))

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.config.settings.checkpoint_strategy == "epoch" or control.should_save:
            self._decide(state, control, end_of_epoch=True)

    # --- async saves (called from the Trainer's `_save_checkpoint`, replaced) ---

    def stages(self, step: int) -> bool:
        """Whether the save the Trainer starts now is ours to stage (else its own runs)."""
        return (
            self.async_save
            and self.config.enabled
            and self._due is not None
            and self._due[0] == step
        )

    def staging_plan(self) -> StagingPlan:
        """How the next save stages, under the budget read as torch's is (staging_budget.py)."""
        from .async_save import choose

        need, forward_changed = self.stager.sizes(self._trainer)
        budget = staging_budget(self.config.staging_budget_bytes, held=self.stager.held_bytes)
        return choose(need, forward_changed, budget, can_hold=bool(self._hooks))

    def _plan_save(self, step: int) -> StagingPlan:
        """`staging_plan`, said in the log: a warning when a save first does not fit (and again
        whenever that changes), counted in `saves_over_budget`."""
        from .async_save import Staging

        plan = self.staging_plan()
        self.stager.plan = plan
        note = plan.note()
        if note is not None:
            self.saves_over_budget += 1
            level = logging.WARNING if plan.mode is not self._last_staging else logging.INFO
            log.log(level, "kubeckpt: the save at step %d is not async: %s", step, note)
        elif self._last_staging not in (None, Staging.WHOLE):
            log.info("kubeckpt: the save at step %d fits the staging budget again", step)
        self._last_staging = plan.mode
        return plan

    def save_staged(self, stage: Any, step: int, epoch: int, *, blocking: bool = False) -> None:
        """Stage (training thread) and hand over to the protocol's writer thread; a JIT save
        (or one that `blocking` says must be written before training goes on) blocks until
        durable; a JIT save then answers preStop."""
        assert self.ckpt is not None and self.stop is not None and self._due is not None
        _, persistent, local, reason = self._due
        self._due = None
        self._saved_step = step
        jit = reason == REASON_JIT
        result = self.ckpt.save(
            step,
            stage,
            persistent=persistent,
            local=local,
            reason=reason,
            blocking=jit or blocking,
            epoch=epoch,
        )
        if jit:
            self.stopped = True
            self.stop.finish(step, result)

    def staged(self, snapshot: Any, error: str | None = None) -> _HFSave:
        self._in_flight = _HFSave(snapshot, self.rank, error)
        return self._in_flight

    def _before_update(self) -> None:
        if self.ckpt is not None and self.stop is not None:
            before_update(self.stop, self.ckpt.session, self._in_flight)

    def _takeover_stage(self, step: int) -> _HFSave:
        """The stop watcher's copy of the state at `step`, the training thread being away."""
        from . import async_save

        self._in_flight = None  # the last save's snapshot: its buffers may be given up
        try:
            # BLOCKING needs no more than HELD here: the stop holds updates until it is durable.
            self._plan_save(step)
            snapshot = async_save.stage(self._trainer, self.stager, step, collectives=False)
        except Exception as e:
            return self.staged(None, f"staging: {type(e).__name__}: {e}")
        finally:
            self.stager.plan = None
        return self.staged(snapshot)

    # --- the synchronous path: the Trainer writes, the protocol commits around it ---

    def _begin_inline(self, step: int, state: Any) -> None:
        assert self.ckpt is not None and self.stop is not None and self._due is not None
        ckpt = self.ckpt
        reason = self._due[3]
        tier = ckpt.persistent
        if tier is None:
            self._due = None
            return
        ckpt.session.wait()
        commit = ckpt.session.commit(
            tier, step, int(state.epoch or 0), manifest=self._walked_manifest(step, state, reason)
        )
        started = time.monotonic()
        error = commit.begin()
        if error is not None:
            self._due = None
            result = SaveResult(step=step, ok=False, reason=reason, error=error)
            ckpt.record(result)
            if reason == REASON_JIT:
                self.stopped = True
                self.stop.finish(step, result)
            return
        self._inline = (commit, started, reason)

    def _walked_manifest(self, step: int, state: Any, reason: str):
        """The Trainer wrote the files itself, some on every rank (FSDP shards): the coordinator
        describes what is in the directory once every rank has reported."""

        def build(tier: Tier, reports: list[Report]) -> Manifest:
            assert self.ckpt is not None
            if any(r.files for r in reports):  # s3://: each rank reported what it uploaded
                return self.ckpt.manifest(tier, step, int(state.epoch or 0), reports, reason)
            return build_manifest(
                tier.write_dir(step),
                step=step,
                epoch=int(state.epoch or 0),
                world_size=self.world_size,
                framework=FRAMEWORK,
                tier=tier.name,
                extra={MANIFEST_REASON: reason},
            )

        return build

    def on_save(self, args, state, control, **kwargs):
        if self._inline is None or self.ckpt is None or self.stop is None:
            return
        commit, started, reason = self._inline
        self._inline = None
        self._due = None
        step = state.global_step
        path = commit.directory
        files: list[Any] = []
        error: str | None = None
        try:
            names = []
            for dirpath, _, filenames in os.walk(path):
                for name in filenames:
                    fsync_file(Path(dirpath, name))
                    rel = Path(dirpath, name).relative_to(path).as_posix()
                    if _owned(rel, self.rank):
                        names.append(rel)
            fsync_dir(path)
            if commit.tier.copy_per_node or self.config.is_remote:
                files = hash_files(path, names)  # uploaded by their writer
        except OSError as e:
            log.error("kubeckpt: cannot fsync %s: %s", path, e)
            error = f"{type(e).__name__}: {e}"
        outcome = commit.finish(files, error)
        seconds = time.monotonic() - started
        result = SaveResult(
            step=step,
            ok=outcome.ok,
            reason=reason,
            locations={commit.tier.name: outcome.location}
            if outcome.ok and outcome.location
            else {},
            error=outcome.error,
            save_seconds=seconds,
            stall_seconds=seconds,
            bytes_written=outcome.bytes_written,
        )
        self._saved_step = step if outcome.ok else None
        self.ckpt.record(result)
        self.ckpt.schedule.restart_interval()
        self._refresh_progress(state)
        if reason == REASON_JIT:
            self.stopped = True
            self.stop.finish(step, result)


def kubeckpt_trainer(
    trainer: Any, config: Config | None = None, *, exit_on_stop: bool = False
) -> Any:
    """Attach kubeckpt to a built Trainer, in one line: `trainer = kubeckpt_trainer(Trainer(...))`.

    Adds the callback (from the environment unless `config` is given), points `output_dir` at
    CHECKPOINT_URI, and makes `trainer.train()` resume from the newest complete checkpoint when
    CHECKPOINT_RESUME is on and no `resume_from_checkpoint` was passed.

    After a just-in-time stop `train()` returns (`trainer.kubeckpt.stopped`; the script exits
    with `trainer.kubeckpt.exit_code`), with a warning. `exit_on_stop` (zero-code mode, whose
    script knows nothing of kubeckpt) instead ends the process with that exit code as soon as the
    Trainer's training loop returns, so that no code after `train()` runs on the partial model.

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
    callback.exit_on_stop = exit_on_stop
    guard_kubeflow_callbacks(trainer, lambda: callback.stopped)
    if callback.config.enabled:
        _install_async_save(trainer, callback)
    train = trainer.train

    def train_with_resume(resume_from_checkpoint=None, *args: Any, **kwargs: Any):
        cfg = callback.config
        if resume_from_checkpoint is None and cfg.enabled and cfg.settings.resume:
            resume_from_checkpoint = callback.restore()
        callback.resumed_from = resume_from_checkpoint
        check_resume(trainer, resume_from_checkpoint)  # another world size: exact, or an error
        output = train(resume_from_checkpoint, *args, **kwargs)
        callback.ended_by_stop()  # zero-code: reached after a stop only without the loop
        return output

    trainer.train = train_with_resume
    if exit_on_stop:
        _end_after_training_loop(trainer, callback)
    return trainer


def _end_after_training_loop(trainer: Any, callback: KubeckptCallback) -> None:
    """End the process where the Trainer's own training loop returns after a stop: every
    callback's `on_train_end` has run and the hub push in flight is waited for, and nothing
    after it has, not even a Trainer subclass's `train()` override that saves or pushes the
    "final" model after `super().train()` (trl's SFTTrainer did). A Trainer without the loop
    (another transformers) ends where `train()` returns instead."""
    inner = getattr(trainer, "_inner_training_loop", None)
    if not callable(inner):
        return

    @functools.wraps(inner)  # accelerate's find_executable_batch_size reads the signature
    def training_loop(*args: Any, **kwargs: Any) -> Any:
        output = inner(*args, **kwargs)
        callback.ended_by_stop()
        return output

    trainer._inner_training_loop = training_loop


def _install_async_save(trainer: Any, callback: KubeckptCallback) -> None:
    """Replace the Trainer's `_save_checkpoint` with stage-then-persist where that is supported."""
    from . import async_save

    reason = "KUBECKPT_ASYNC_SAVE=false" if not callback.config.async_save else None
    reason = reason or async_save.async_unsupported(trainer)
    if reason is not None:
        log.info("kubeckpt: synchronous checkpoint saves (%s)", reason)
        return
    callback.async_save = True
    callback.stager = async_save.Stager()
    callback._trainer = trainer
    own_save = trainer._save_checkpoint

    def save_checkpoint(model: Any, trial: Any = None) -> None:
        step = trainer.state.global_step
        if trial is not None or not callback.stages(step):
            return own_save(model, trial)  # not one of our saves: the Trainer's own, as before
        epoch = int(trainer.state.epoch or 0)

        # A stop's save blocks until durable: nothing to overlap the copy with.
        overlap = callback.config.overlap_staging and not callback.stopping
        try:
            plan = callback._plan_save(step)
        except Exception as e:  # sizing failed: the save still runs, staged whole as before
            log.warning("kubeckpt: cannot size the save at step %d for staging: %s", step, e)
            plan = None

        def stage() -> _HFSave:
            callback._in_flight = None  # the last save's snapshot: its buffers may be given up
            callback.stager.overlap = overlap
            callback.stager.plan = plan
            try:
                snapshot = async_save.stage(trainer, callback.stager, step)
            except Exception as e:  # this save fails (every rank agrees); training goes on
                log.error("kubeckpt: cannot stage the checkpoint at step %d: %s", step, e)
                return callback.staged(None, f"staging: {type(e).__name__}: {e}")
            finally:
                callback.stager.overlap = False
                callback.stager.plan = None
            return callback.staged(snapshot)

        blocking = plan is not None and plan.mode is async_save.Staging.BLOCKING
        callback.save_staged(stage, step, epoch, blocking=blocking)

    trainer._save_checkpoint = save_checkpoint
