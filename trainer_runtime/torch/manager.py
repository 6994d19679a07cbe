"""CheckpointManager: the one object a PyTorch training loop adopts.

    mgr = CheckpointManager.from_env(model, optimizer, scheduler=sched, sampler=sampler,
                                     total_steps=total)
    step = mgr.restore()                      # 0, or the step of the newest complete checkpoint
    while step < total:
        ...forward, backward, optimizer.step()...
        step += 1
        if mgr.step_end(step, epoch=epoch, loss=loss):
            break                             # a just-in-time checkpoint was saved: exit 0
    mgr.close()

Threads: the training (main) thread takes snapshots and decides; one writer thread persists, in
order, one save at a time. The two use separate gloo groups, so the per-step agreement never waits
behind a save's collectives.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from .. import handover, layout
from ..config import Config
from ..contract import (
    INCOMPLETE_SENTINEL,
    MANIFEST_FILE,
    PREEMPTED_EXIT_CODE,
    Manifest,
    ManifestFile,
    checkpoint_dir_name,
    format_rfc3339,
    read_manifest,
)
from ..fsutil import write_durable
from ..progress_writer import ProgressWriter
from ..storage import LocalTier, Tier, persistent_tier
from ..timing import Schedule, StepTimer
from ..triggers import RequestFile, SignalTrigger
from . import dcp as dcp_format
from . import plain
from .agreement import Collectives
from .staging import Staged, Stager
from .state import (
    apply_rng,
    capture_rng,
    cpu_copy,
    iter_tensors,
    load_object_state,
    local_tensor,
    object_state,
)

log = logging.getLogger("trainer_runtime.torch")

FRAMEWORK = "pytorch"


class RestoreError(RuntimeError):
    """No checkpoint could be loaded after one was partly loaded in place: state is unusable."""


@dataclass
class SaveResult:
    """What became of one save. `locations` maps tier name to where it landed."""

    step: int
    ok: bool
    locations: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    save_seconds: float = 0.0  # from the snapshot until durable everywhere
    stall_seconds: float = 0.0  # how long the training thread was held up
    persist_seconds: float = 0.0  # the writer thread's part: write, fsync, hash, commit
    bytes_written: int = 0  # by this rank


@dataclass
class _Pending:
    future: Future[SaveResult]
    staged: Staged
    step: int
    stall: float


class CheckpointManager:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
        *,
        config: Config,
        scheduler: Any = None,
        scaler: Any = None,
        sampler: Any = None,
        extras: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        total_epochs: int | None = None,
    ) -> None:
        self.config = config
        s = config.settings
        self.model = model
        if optimizer is None:
            self.optimizers: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, torch.optim.Optimizer):
            self.optimizers = [optimizer]
        else:
            self.optimizers = list(optimizer)
        self.scheduler = scheduler
        self.scaler = scaler
        self.sampler = sampler
        self.extras = dict(extras or {})

        initialized = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self.world_size > 1 else 0
        self.node = socket.gethostname()
        self.enabled = config.enabled

        # Two groups, created in the same order on every rank: one for the training thread's
        # per-step agreement, one for the writer thread's save protocol.
        self._comm = Collectives.create() if self.enabled else Collectives(None, 1, 0)
        self._io = Collectives.create() if self.enabled else Collectives(None, 1, 0)
        self._agreement = self._comm.pipelined(2)

        self.persistent: Tier | None = None
        self.local: LocalTier | None = None
        if self.enabled:
            assert s.checkpoint_uri is not None  # RuntimeSettings guarantees it when enabled
            self.persistent = persistent_tier(s.checkpoint_uri, config.resolved_staging_dir())
            if s.local_dir:
                self.local = LocalTier(s.local_dir, "local")

        self.progress = ProgressWriter(
            s.progress_file,
            enabled=self.rank == 0,
            every=s.progress_update_frequency,
            total_steps=total_steps,
            total_epochs=total_epochs,
            checkpointing_enabled=self.enabled,
            termination_log=config.termination_log,
        )
        self._signal: SignalTrigger | None = None
        self._request: RequestFile | None = None
        if self.enabled and s.jit:
            self._signal = SignalTrigger()
            self._signal.install()
            self._request = RequestFile(s.control_dir)

        self._schedule = Schedule(s, local_enabled=self.local is not None)
        self._timer = StepTimer()
        self._stager = Stager()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubeckpt-persist")
        self._pending: _Pending | None = None
        self._hooks = [
            opt.register_step_pre_hook(self._before_optimizer_step) for opt in self.optimizers
        ]

        self.epoch = 0
        self.step = 0
        self.resumed_from: str | None = None  # "checkpoint-<step>"
        self._loaded_time: str | None = None  # the resumed checkpoint's manifest time
        self.resumed_tier: str | None = None  # "local" or "persistent"
        self.last_result: SaveResult | None = None
        self.last_error: str | None = None
        self.failed_saves = 0
        self.stopped = False
        self._closed = False
        self._durable_step: int | None = None  # newest step known saved in the persistent tier
        self._last_stats: dict[str, Any] = {}
        self._last_report: tuple[Any, Any, Any] = (None, None, None)
        self._warmed = False
        # A script that never calls close() (an exception, sys.exit) still leaves its final record
        # for `kubectl`; nothing more happens at exit, where other ranks may already be gone.
        atexit.register(self._at_exit)

    @classmethod
    def from_env(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
        *,
        scheduler: Any = None,
        scaler: Any = None,
        sampler: Any = None,
        extras: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        total_epochs: int | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> CheckpointManager:
        """Everything from the environment DESIGN.md defines; keyword overrides win."""
        return cls(
            model,
            optimizer,
            config=Config.from_env(environ, **overrides),
            scheduler=scheduler,
            scaler=scaler,
            sampler=sampler,
            extras=extras,
            total_steps=total_steps,
            total_epochs=total_epochs,
        )

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ restore

    def restore(self) -> int:
        """Load the newest complete checkpoint that verifies; the step to continue from (0: none).

        Incomplete checkpoints are deleted first. A checkpoint that fails verification or loading
        is skipped for the next one, local and persistent tiers alike (the local tier first when
        both hold the same step, being faster).
        """
        s = self.config.settings
        if not self.enabled or not s.resume:
            return 0
        self._remove_incomplete()
        dirty = False
        for step, tier in self._candidates():
            ok, touched = self._try_load(step, tier)
            dirty = dirty or touched
            if ok:
                self.step = step
                self.resumed_from = checkpoint_dir_name(step)
                self.resumed_tier = tier.name
                self.progress.resumed(self.resumed_from, tier.location(step), self._loaded_time)
                if tier is self.persistent:
                    self._durable_step = step
                self._schedule.restart_interval()
                log.info("kubeckpt: resumed from %s (%s tier)", tier.location(step), tier.name)
                return step
        if dirty:
            raise RestoreError(
                "every checkpoint failed to load after one was partly loaded into the model: "
                "the in-memory state is inconsistent; restart the process"
            )
        log.info("kubeckpt: no usable checkpoint, starting from step 0")
        return 0

    def _remove_incomplete(self) -> None:
        # A pod being replaced may still be writing a newer checkpoint (handover.py): rank 0
        # waits for it before deleting leftovers and listing; the other ranks at the barrier.
        if isinstance(self.persistent, LocalTier) and self.rank == 0:
            try:
                handover.wait_for_saves_in_flight(self.persistent.root)
            except OSError as e:
                log.warning("kubeckpt: cannot check for a save in flight: %s", e)
        try:
            if self.persistent is not None and self.rank == 0:
                self.persistent.remove_incomplete()
            if self.local is not None and self.local_rank == 0:
                self.local.remove_incomplete()
        except Exception as e:  # cleanup is best effort: a read-only tier must not stop a resume
            log.warning("kubeckpt: could not remove incomplete checkpoints: %s", e)
        self._comm.barrier()

    def _candidates(self) -> list[tuple[int, Tier]]:
        persistent_steps: list[int] = []
        if self.persistent is not None and self.rank == 0:
            try:
                persistent_steps = [e.step for e in self.persistent.scan() if e.complete]
            except Exception as e:
                log.warning("kubeckpt: cannot list %s: %s", self.persistent, e)
        persistent_steps = self._comm.broadcast(persistent_steps)
        mine: list[int] = []
        if self.local is not None:
            for entry in self.local.scan():
                if entry.complete and self._local_usable(entry.step):
                    mine.append(entry.step)
        # A local checkpoint is usable only if every rank has its part (ramdisks are per node).
        common = set(mine)
        for steps in self._comm.all_gather(mine):
            common &= set(steps)
        found: list[tuple[int, Tier]] = []
        if self.local is not None:
            found += [(step, self.local) for step in common]
        if self.persistent is not None:
            found += [(step, self.persistent) for step in persistent_steps]
        found.sort(key=lambda c: (-c[0], c[1] is not self.local))
        return found

    def _local_usable(self, step: int) -> bool:
        assert self.local is not None
        try:
            manifest = read_manifest(self.local.write_dir(step))
        except (OSError, ValueError):
            return False
        names = {f.path for f in manifest.files}
        return manifest.world_size == self.world_size and plain.state_file(self.rank) in names

    def _try_load(self, step: int, tier: Tier) -> tuple[bool, bool]:
        """(loaded, state touched). Every rank makes the same collective calls whatever fails."""
        where = tier.location(step)
        fetcher = self.local_rank == 0 if not tier.shared else self.rank == 0
        problems: list[str] = []
        path = tier.fetch_dir(step)
        if fetcher:
            try:
                path = tier.fetch(step)
                _, problems = layout.verify_checkpoint(
                    path, checksums=self.config.should_verify_checksums
                )
            except Exception as e:
                problems = [f"cannot fetch: {e}"]
        if problems:
            log.warning("kubeckpt: skipping %s: %s", where, "; ".join(problems[:5]))
        if not self._comm.all_ok(not problems):
            self._release_fetched(tier, step, fetcher)
            return False, False
        touched = False
        try:
            manifest = read_manifest(path)
            self._loaded_time = manifest.time
            info = manifest.extra.get("kubeckpt", {})
            fmt = info.get("format", "plain") if isinstance(info, dict) else "plain"
            small = self._read_small(path, manifest, fmt)
            ok = True
        except Exception as e:
            log.warning("kubeckpt: skipping %s: %s", where, e)
            ok = False
        if self._comm.all_ok(ok):
            touched = True
            try:
                targets = self._targets()
                if fmt == "dcp":
                    dcp_format.load(path, targets, self._comm.group)
                    tree = targets
                else:
                    src = self._plain_source_rank(manifest)
                    tree = plain.read_rank(path, src, targets, small["_meta"])
                self._apply_tensors(tree)
                self._apply_small(small["state"], same_rank=small["same_rank"], manifest=manifest)
                ok = True
            except Exception as e:
                log.warning("kubeckpt: loading %s failed: %s", where, e)
                ok = False
            ok = self._comm.all_ok(ok)
        else:
            ok = False
        self._release_fetched(tier, step, fetcher)
        return ok, touched

    def _release_fetched(self, tier: Tier, step: int, fetcher: bool) -> None:
        self._comm.barrier()
        if fetcher:
            tier.release_fetched(step)

    def _plain_source_rank(self, manifest: Manifest) -> int:
        if manifest.world_size == self.world_size:
            return self.rank
        if manifest.world_size == 1:
            return 0  # a single-process checkpoint holds the full state: every rank can use it
        raise ValueError(
            f"per-rank checkpoint of world size {manifest.world_size} cannot be loaded by "
            f"{self.world_size} ranks"
        )

    def _read_small(self, path: Path, manifest: Manifest, fmt: str) -> dict[str, Any]:
        if fmt == "plain":
            src = self._plain_source_rank(manifest)
            meta = plain.read_state(path, src)
            return {"state": meta["state"], "same_rank": src == self.rank, "_meta": meta}
        same = manifest.world_size == self.world_size
        name = plain.state_file(self.rank)
        if not (path / name).exists():
            return {"state": {}, "same_rank": False}
        with open(path / name, "rb") as f:
            data = torch.load(f, map_location="cpu", weights_only=True)
        return {"state": data.get("state", {}), "same_rank": same}

    def _targets(self) -> dict[str, Any]:
        """The live state dict (tensors share storage with the model): loads go in place."""
        if self.optimizers:
            msd, osd = get_state_dict(self.model, self.optimizers)
            return {"model": msd, "optim": osd}
        return {"model": get_model_state_dict(self.model)}

    def _apply_tensors(self, tree: dict[str, Any]) -> None:
        if self.optimizers:
            set_state_dict(
                self.model,
                self.optimizers,
                model_state_dict=tree["model"],
                optim_state_dict=tree["optim"],
            )
        else:
            set_model_state_dict(self.model, tree["model"])

    def _apply_small(self, state: dict[str, Any], *, same_rank: bool, manifest: Manifest) -> None:
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.sampler is not None and "sampler" in state:
            if same_rank:
                self.sampler.load_state_dict(state["sampler"])
            else:  # another world size: the position means something else; keep the epoch
                self.sampler.set_epoch(int(state["sampler"].get("epoch", manifest.epoch)))
        for name, obj in self.extras.items():
            if name in state.get("extras", {}):
                load_object_state(obj, state["extras"][name])
            else:
                log.warning("kubeckpt: checkpoint has no state for extra %r", name)
        if same_rank and "buffers" in state:
            live = dict(self.model.named_buffers())
            with torch.no_grad():
                for name, value in state["buffers"].items():
                    if name in live and live[name].shape == value.shape:
                        live[name].copy_(value)
                    else:
                        log.warning("kubeckpt: buffer %s does not match the model; skipped", name)
        self.epoch = int(state.get("epoch", manifest.epoch))
        if same_rank and "rng" in state:
            apply_rng(state["rng"])  # last, so nothing above consumes random numbers after it
        elif not same_rank:
            log.warning("kubeckpt: rank %d has no saved RNG state; keeping its own", self.rank)

    # ------------------------------------------------------------------ per step

    def step_end(
        self,
        step: int,
        *,
        epoch: int | None = None,
        loss: Any = None,
        learning_rate: Any = None,
        metrics: Mapping[str, Any] | None = None,
        end_of_epoch: bool = False,
    ) -> bool:
        """Call after each optimizer step with the number of steps done. Saves when due; returns
        True when the loop must stop (a just-in-time checkpoint was taken, or its attempt ended).

        `loss` may be a tensor: it is read (synchronising the device) only on progress writes.
        """
        if self.stopped:
            return True
        self.step = step
        if epoch is not None:
            self.epoch = epoch
        elif self.sampler is not None and hasattr(self.sampler, "epoch"):
            self.epoch = int(self.sampler.epoch)
        self._timer.observe(step)
        self._last_report = (loss, learning_rate, metrics)
        self._reap()
        if (
            not self._warmed
            and self.enabled
            and self.config.async_save
            and all(opt.state for opt in self.optimizers)
        ):
            # Once the optimizer's state exists the buffers can be sized (and faulted in) ahead.
            self._warmed = True
            self._stager.warm(self._targets())
        stop = persist = local = False
        if self.enabled:
            decision = self._schedule.decide(step, end_of_epoch=end_of_epoch)
            timed = self.config.settings.checkpoint_strategy == "time"
            # The time strategy reads the clock: only rank 0's reading counts, or ranks disagree.
            vote = timed and decision.persistent and self.rank == 0
            if vote:
                self._schedule.restart_interval()  # one vote per interval, not one per step
            agreed = self._agreement.exchange([int(self._jit_requested()), int(vote)])
            stop = bool(agreed and agreed[0])
            persist = bool(agreed and agreed[1]) if timed else decision.persistent
            local = decision.local  # a step count: the same on every rank without asking
        if stop:
            self._jit_stop(step)
            self._write_progress(step, loss, learning_rate, metrics, final=True)
            return True
        if persist or local:
            self._save(
                step,
                persistent=persist,
                local=local,
                blocking=not self.config.async_save,
            )
        if self.progress.due(step):
            self._write_progress(step, loss, learning_rate, metrics)
        return False

    @property
    def exit_code(self) -> int:
        """What the training process should exit with: 0, or PREEMPTED_EXIT_CODE (143) after a
        just-in-time stop, so that the job controller restarts the job instead of counting the
        preempted pod a success (`return mgr.exit_code` at the end of the script)."""
        return PREEMPTED_EXIT_CODE if self.stopped else 0

    def _jit_requested(self) -> bool:
        if self._signal is not None and self._signal.fired:
            return True
        return self._request is not None and self._request.pending()

    def _jit_stop(self, step: int) -> None:
        self.stopped = True
        self._agreement.collect()  # every rank started one more; let them all finish it
        log.warning("kubeckpt: stop requested; saving a just-in-time checkpoint at step %d", step)
        self._wait_pending()
        result: SaveResult | None = None
        if self._durable_step == step:
            ok, where, error = True, self._last_stats.get("location"), None
        else:
            result = self._save(step, persistent=True, local=self.persistent is None, blocking=True)
            ok = result is not None and result.ok
            where = next(iter(result.locations.values()), None) if result and result.ok else None
            error = result.error if result else "no checkpoint tier configured"
        if ok:
            self.progress.checkpoint_was_jit()
        if self._request is not None and self.local_rank == 0:
            detail: dict[str, Any] = {"step": step}
            if where:
                detail["checkpoint"] = where
            if error:
                detail["error"] = error
            self._request.acknowledge(ok, detail)

    # ------------------------------------------------------------------ saving

    def save(self, step: int | None = None, *, blocking: bool = True) -> SaveResult | None:
        """Save now to the persistent tier (every rank must call it at the same step)."""
        step = self.step if step is None else step
        return self._save(step, persistent=True, local=False, blocking=blocking)

    def _save(
        self, step: int, *, persistent: bool, local: bool, blocking: bool
    ) -> SaveResult | None:
        self._wait_pending()  # a new save waits for the previous one
        tiers: list[Tier] = []
        if local and self.local is not None:
            tiers.append(self.local)
        if persistent and self.persistent is not None:
            tiers.append(self.persistent)
        if not tiers:
            return None
        t0 = time.perf_counter()
        tree = self._snapshot_tree()
        late = None
        if self.config.overlap_staging and not blocking:
            ptrs = self._late_pointers(tree)
            late = lambda t: t.data_ptr() in ptrs  # noqa: E731
        staged = self._stager.stage(tree, late=late, copy_cpu=not blocking)
        small = self._small_state(step)
        stall = time.perf_counter() - t0
        future = self._executor.submit(self._persist, step, self.epoch, staged, small, tiers, t0)
        self._pending = _Pending(future, staged, step, stall)
        if blocking:
            return self._wait_pending()
        return None

    def _snapshot_tree(self) -> dict[str, Any]:
        return self._targets()

    def _late_pointers(self, tree: dict[str, Any]) -> set[int]:
        """Storage of tensors only optimizer.step() changes: parameters and optimizer state."""
        ptrs = {local_tensor(p.detach()).data_ptr() for p in self.model.parameters()}
        for _, t in iter_tensors(tree.get("optim", {}).get("state", {})):
            ptrs.add(local_tensor(t.detach()).data_ptr())
        ptrs.discard(0)
        return ptrs

    def _small_state(self, step: int) -> dict[str, Any]:
        state: dict[str, Any] = {"step": step, "epoch": self.epoch, "rng": capture_rng()}
        if self.scheduler is not None:
            state["scheduler"] = cpu_copy(self.scheduler.state_dict())
        if self.scaler is not None:
            state["scaler"] = cpu_copy(self.scaler.state_dict())
        if self.sampler is not None:
            state["sampler"] = dict(self.sampler.state_dict())
        if self.extras:
            state["extras"] = {k: cpu_copy(object_state(v)) for k, v in self.extras.items()}
        if self.world_size > 1:
            # DCP keeps one copy of a plain tensor all ranks hold under one key; buffers such as
            # BatchNorm statistics differ per rank (FSDP never syncs them), so each rank keeps its
            # own here and gets them back exactly.
            state["buffers"] = {
                name: buf.detach().to("cpu", copy=True)
                for name, buf in self.model.named_buffers()
                if local_tensor(buf) is buf
            }
        return state

    def _before_optimizer_step(self, *_args: Any) -> None:
        pending = self._pending
        if pending is not None and not pending.future.done():
            t0 = time.perf_counter()
            pending.staged.wait_before_update()
            pending.stall += time.perf_counter() - t0

    def _reap(self) -> None:
        if self._pending is not None and self._pending.future.done():
            self._wait_pending()

    def _wait_pending(self) -> SaveResult | None:
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        result = pending.future.result()
        result.stall_seconds = pending.stall
        self._on_result(result)
        return result

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable or has failed; its result."""
        return self._wait_pending()

    def _on_result(self, result: SaveResult) -> None:
        self.last_result = result
        c = self.progress.checkpointing
        if not result.ok:
            self.failed_saves += 1
            self.last_error = result.error
            log.error("kubeckpt: checkpoint at step %d failed: %s", result.step, result.error)
            c.extra["failedSaves"] = self.failed_saves
            c.extra["lastError"] = (result.error or "")[:300]
            return
        if "persistent" in result.locations:
            self._durable_step = result.step
            self._last_stats = {"location": result.locations["persistent"]}
            self.progress.checkpoint_saved(
                result.locations["persistent"],
                save_seconds=result.save_seconds,
                stall_seconds=result.stall_seconds,
            )
        if "local" in result.locations:
            c.extra["latestLocalCheckpoint"] = result.locations["local"]
            c.extra["localCheckpointsCreated"] = int(c.extra.get("localCheckpointsCreated", 0)) + 1

    # ------------------------------------------------------------------ writer thread

    def _persist(
        self,
        step: int,
        epoch: int,
        staged: Staged,
        small: dict[str, Any],
        tiers: list[Tier],
        t0: float,
    ) -> SaveResult:
        """Runs on the writer thread. Every rank makes the same collective calls in the same
        order whatever fails, so one rank's error never leaves another waiting."""
        result = SaveResult(step=step, ok=True)
        error: str | None = None
        try:
            staged.wait()
        except Exception as e:
            error = f"staging: {e}"
        if not self._io.all_ok(error is None):
            result.ok = False
            result.error = error or "staging failed on another rank"
            return result
        t1 = time.perf_counter()
        for tier in tiers:
            ok, outcome, size = self._persist_tier(tier, step, epoch, staged.tree, small)
            result.bytes_written += size
            if ok:
                result.locations[tier.name] = outcome
            else:
                result.ok = False
                result.error = f"{tier.name} tier: {outcome}"
        result.persist_seconds = time.perf_counter() - t1
        result.save_seconds = time.perf_counter() - t0
        return result

    def _persist_tier(
        self, tier: Tier, step: int, epoch: int, tree: dict[str, Any], small: dict[str, Any]
    ) -> tuple[bool, str, int]:
        """(ok, location or error, bytes this rank wrote)."""
        group = self._io
        node_local = not tier.shared
        coordinator = self.local_rank == 0 if node_local else self.rank == 0
        fmt = "dcp" if tier.name == "persistent" and self.world_size > 1 else "plain"
        error: str | None = None
        if coordinator:
            try:
                tier.begin(step)
            except Exception as e:
                error = _describe(e)
        if not group.all_ok(error is None):
            if coordinator and error is None:
                self._discard(tier, step)
            return False, error or "another rank could not start the checkpoint", 0
        directory = tier.write_dir(step)
        written: list[plain.WrittenFile] = []
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if fmt == "plain":
                written = plain.write_rank(directory, self.rank, tree, small)
        except Exception as e:
            error = _describe(e)
        if fmt == "dcp":
            # dcp.save is collective: enter it on every rank; it raises on all when one fails.
            try:
                if group.all_ok(error is None):
                    dcp_format.save(directory, tree, group.group)
                    written = self._write_dcp_rank_files(directory, small)
                else:
                    error = error or "another rank failed before writing"
            except Exception as e:
                error = _describe(e)
        if error is None:
            try:
                tier.publish(step, [w.path for w in written])
            except Exception as e:
                error = f"upload: {_describe(e)}"
        reports = group.all_gather(
            {
                "ok": error is None,
                "error": error,
                "node": self.node,
                "rank": self.rank,
                "files": [(w.path, w.size, w.sha256) for w in written],
            }
        )
        failures = [f"rank {r['rank']}: {r['error']}" for r in reports if not r["ok"]]
        location = tier.location(step)
        commit_error: str | None = None
        if coordinator:
            if failures:
                self._discard(tier, step)
            else:
                try:
                    mine = [r for r in reports if not node_local or r["node"] == self.node]
                    manifest = self._manifest(step, epoch, tier, fmt, mine)
                    location = tier.commit(step, manifest)
                    keep = self.config.local_keep if tier.name == "local" else None
                    tier.retain(keep or self.config.settings.max_checkpoints)
                except Exception as e:
                    commit_error = _describe(e)
                    self._discard(tier, step)
        committed = group.all_ok(commit_error is None)
        tier.release(step)
        size = sum(w.size for w in written)
        if failures:
            return False, "; ".join(failures), size
        if not committed:
            return False, commit_error or "commit failed on another node", size
        return True, location, size

    def _write_dcp_rank_files(
        self, directory: Path, small: dict[str, Any]
    ) -> list[plain.WrittenFile]:
        buf = io.BytesIO()
        torch.save({"format": "kubeckpt-rank-state/1", "state": small}, buf)
        name = plain.state_file(self.rank)
        write_durable(directory / name, buf.getbuffer())
        others = {plain.state_file(r) for r in range(self.world_size) if r != self.rank}
        others |= {INCOMPLETE_SENTINEL, MANIFEST_FILE}
        names = dcp_format.owned_files(directory, self.rank, others)
        names = [n for n in names if n != name]
        return [*dcp_format.hash_files(directory, names), *dcp_format.hash_files(directory, [name])]

    def _manifest(
        self, step: int, epoch: int, tier: Tier, fmt: str, reports: list[dict[str, Any]]
    ) -> Manifest:
        files: dict[str, ManifestFile] = {}
        for report in reports:
            for path, size, sha in report["files"]:
                files[path] = ManifestFile(path=path, size=size, sha256=sha)
        return Manifest(
            step=step,
            epoch=epoch,
            time=format_rfc3339(),
            world_size=self.world_size,
            framework=FRAMEWORK,
            tier=tier.name,
            files=[files[p] for p in sorted(files)],
            extra={
                "kubeckpt": {
                    "format": fmt,
                    "ranks": sorted(r["rank"] for r in reports),
                    "torch": torch.__version__,
                }
            },
        )

    def _discard(self, tier: Tier, step: int) -> None:
        try:
            tier.discard(step)
        except Exception as e:
            log.warning("kubeckpt: could not remove the failed checkpoint %s: %s", step, e)

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
        if learning_rate is None and self.optimizers:
            learning_rate = self.optimizers[0].param_groups[0].get("lr")
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float().item()
        if isinstance(learning_rate, torch.Tensor):
            learning_rate = learning_rate.item()
        record = self.progress.build(
            step,
            epoch=self.epoch,
            loss=loss,
            learning_rate=learning_rate,
            step_seconds=self._timer.step_seconds,
            eta_seconds=self._timer.eta_seconds(step, self.progress.total_steps),
            metrics=dict(metrics or {}),
        )
        if final:
            self.progress.write_final(record)
        else:
            self.progress.write(record)

    def close(self) -> None:
        """Wait for the save in flight, write the final progress record and the termination
        message, and remove hooks and signal handlers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        try:
            self._agreement.collect()
            self._wait_pending()
        finally:
            for hook in self._hooks:
                hook.remove()
            if self._signal is not None:
                self._signal.uninstall(stopping=self.stopped)
            self._executor.shutdown(wait=True)
            if not self.stopped:
                self._write_progress(self.step, *self._last_report, final=True)
            if self._request is not None and self.local_rank == 0 and not self.stopped:
                if self._request.pending():
                    # A preStop arrived as training ended: answer rather than let it wait.
                    self._request.acknowledge(False, {"error": "training ended without saving"})

    def _at_exit(self) -> None:
        if not self._closed and not self.stopped:
            self._write_progress(self.step, *self._last_report, final=True)


def _describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 500 else text[:497] + "..."
