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

This is the PyTorch adapter of the save protocol (trainer_runtime.protocol): it supplies the
agreement (two gloo groups, created in the same order on every rank: one for the training
thread's per-step question, one for the writer thread, so the per-step agreement never waits
behind a save's collectives), staging (a CPU copy, parameters and optimizer state copied late,
while the next forward/backward runs), the writers (DCP for a multi-rank persistent checkpoint,
the per-rank plain format otherwise) and the loader.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

from ..adapter import AdapterBase, before_update
from ..config import Config
from ..contract import (
    INCOMPLETE_SENTINEL,
    MANIFEST_FILE,
    Manifest,
)
from ..fsutil import write_durable
from ..protocol import Report, RestoreError, SaveResult
from ..staging_budget import staging_budget
from ..storage import Tier
from . import dcp as dcp_format
from . import plain, reshard, workers
from .agreement import destroy_groups, groups, member
from .staging import Chunked, Staged, Stager
from .state import (
    apply_rng,
    capture_rng,
    cpu_copy,
    iter_tensors,
    load_object_state,
    local_tensor,
    object_state,
)
from .state_dict_view import StateDictView

log = logging.getLogger("trainer_runtime.torch")

FRAMEWORK = "pytorch"

__all__ = ["CheckpointManager", "RestoreError", "SaveResult"]


class _TorchSave:
    """One staged save: the protocol's `Staged` for torch."""

    def __init__(self, mgr: CheckpointManager, staged: Staged, small: dict[str, Any]) -> None:
        self.mgr = mgr
        self.staged = staged
        self.small = small

    def prepare(self) -> None:
        self.staged.wait()

    def planned(self, tiers: list[Tier]) -> None:
        if isinstance(self.staged, Chunked):
            self.staged.planned(len(tiers))

    def finished(self) -> None:
        if isinstance(self.staged, Chunked):
            self.staged.finished()

    def write(self, tier: Tier, directory: Path) -> list[plain.WrittenFile]:
        mgr = self.mgr
        chunked = self.staged if isinstance(self.staged, Chunked) else None
        try:
            if mgr._format(tier) == "plain":
                stream = None if chunked is None else chunked.stream
                return plain.write_rank(
                    directory,
                    mgr.rank,
                    self.staged.tree,
                    self.small,
                    stream=stream,
                    around_page_cache=not tier.read_back,
                )
            # dcp.save is collective: the protocol enters writers on every rank or on none. A
            # chunked save hands DCP the live tensors (training waits until it is done).
            written = dcp_format.save(directory, self.staged.tree, mgr._io.group)
            return mgr._write_dcp_rank_files(directory, self.small, written)
        finally:
            if chunked is not None:
                chunked.wrote()


class _TorchLoader:
    """The protocol's `Loader` for torch: small state first (nothing touched), tensors in place."""

    def __init__(self, mgr: CheckpointManager) -> None:
        self.mgr = mgr

    def prepare(self, path: Path, manifest: Manifest, tier: Tier) -> tuple[str, dict[str, Any]]:
        info = manifest.extra.get("kubeckpt", {})
        fmt = info.get("format", "plain") if isinstance(info, dict) else "plain"
        return fmt, self.mgr._read_small(path, manifest, fmt)

    def verified_in_load(self, manifest: Manifest) -> frozenset[str]:
        """The plain format's tensor shards of the rank this process reads: `apply` hashes them
        as it reads them, so restore reads them from the device once, not twice."""
        info = manifest.extra.get("kubeckpt", {})
        if (info.get("format", "plain") if isinstance(info, dict) else "plain") != "plain":
            return frozenset()
        try:
            src = self.mgr._plain_source_rank(manifest)
        except ValueError:
            return frozenset()  # not loadable here: prepare says why
        return frozenset(f.path for f in plain.shard_files(manifest, src).values())

    def apply(
        self,
        prepared: tuple[str, dict[str, Any]],
        path: Path,
        manifest: Manifest,
        tier: Tier,
        verify: frozenset[str] = frozenset(),
    ) -> None:
        mgr = self.mgr
        fmt, small = prepared
        targets = mgr._targets()
        if fmt == "dcp":
            dcp_format.load(path, targets, mgr._io.group)
            tree = targets
        else:
            src = mgr._plain_source_rank(manifest)
            shards = plain.shard_files(manifest, src)
            checked = {k: f for k, f in shards.items() if f.path in verify}
            tree = plain.read_rank(path, src, targets, small["_meta"], checked)
        mgr._apply_tensors(tree)
        mgr._apply_small(small["state"], same_rank=small["same_rank"], manifest=manifest)


class CheckpointManager(AdapterBase):
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

        me = member()
        self.rank, self.local_rank, self.world_size = me.rank, me.local_rank, me.world_size
        self.node = me.node
        # Three groups, created in the same order on every rank (see the module docstring); the
        # third is the stop watcher's (stop/watcher.py).
        self._comm, self._io, self._ctl = groups(config.enabled)
        self._start(
            config,
            framework=FRAMEWORK,
            me=me,
            comm=self._comm,
            io=self._io,
            total_steps=total_steps,
            total_epochs=total_epochs,
        )
        if self.enabled and config.settings.jit:
            workers.install()  # DataLoader workers outlive the stop signal (workers.py)
        self._state_dicts = StateDictView(model, self.optimizers)
        self._stager = Stager()
        self._staged: Staged | None = None  # the copy the save in flight is writing
        self._chunk_hold = False  # a chunked save training must wait for before the next step
        self._hooks = [
            opt.register_step_pre_hook(self._before_optimizer_step) for opt in self.optimizers
        ]
        if self.optimizers:
            # The first optimizer's step is the training step (a GAN's second is part of it).
            self._hooks.append(
                self.optimizers[0].register_step_post_hook(lambda *_: self._stop.mark_update())
            )
        self._warmed = False
        self._stop.start_watcher(self._ctl, lambda step: self._stage(step, blocking=True))

    def _close(self, *, together: bool) -> None:
        try:
            super()._close(together=together)
        finally:
            self._stager.close()  # after the save in flight, which close waits for

    def _end_groups(self, watcher_ended: bool) -> None:
        # A watcher still in a collective on its group (a rank gone): leave that one.
        destroy_groups((self._comm, self._io, self._ctl if watcher_ended else None))

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

    # ------------------------------------------------------------------ restore

    def restore(self) -> int:
        """Load the newest complete checkpoint that verifies; the step to continue from (0: none).

        Incomplete checkpoints are deleted first. A checkpoint that fails verification or loading
        is skipped for the next one, local and persistent tiers alike (the local tier first when
        both hold the same step, being faster).
        """
        restored = self._restore(_TorchLoader(self), needs=plain.state_file(self.rank))
        return 0 if restored is None else restored.step

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
        if not same:  # every old rank's state; the sampler position is mapped to these ranks
            state = reshard.small_state(path, manifest.world_size, self.rank)
            return {"state": state, "same_rank": False}
        name = plain.state_file(self.rank)
        if not (path / name).exists():
            return {"state": {}, "same_rank": False}
        with open(path / name, "rb") as f:
            data = torch.load(f, map_location="cpu", weights_only=True)
        return {"state": data.get("state", {}), "same_rank": same}

    def _targets(self) -> dict[str, Any]:
        """The live state dict (tensors share storage with the model): loads go in place."""
        msd, osd = self._state_dicts.get()
        return {"model": msd, "optim": osd} if self.optimizers else {"model": msd}

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
            if same_rank or reshard.maps_world_size(self.sampler):
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
        if epoch is None and self.sampler is not None and hasattr(self.sampler, "epoch"):
            epoch = int(self.sampler.epoch)
        if not self.stopped:
            self._warm()
        stop = self._step_end(
            step,
            lambda blocking: self._stage(step, blocking=blocking),
            epoch=epoch,
            loss=loss,
            learning_rate=learning_rate,
            metrics=metrics,
            end_of_epoch=end_of_epoch,
        )
        self._hold_for_chunked()
        return stop

    def _warm(self) -> None:
        """Once the optimizer's state exists the buffers can be sized (and faulted in) ahead."""
        if (
            not self._warmed
            and self.enabled
            and self.config.async_save
            and all(opt.state for opt in self.optimizers)
        ):
            self._warmed = True
            tree = self._targets()
            need = self._stager.stage_bytes(tree)
            if need <= staging_budget(self.config.staging_budget_bytes):
                self._stager.warm(tree)  # else saves are chunked: no full-size buffers

    # ------------------------------------------------------------------ saving

    def save(self, step: int | None = None, *, blocking: bool = True) -> SaveResult | None:
        """Save now to the persistent tier (every rank must call it at the same step)."""
        step = self.step if step is None else step
        result = self._save(step, lambda: self._stage(step, blocking=blocking), blocking=blocking)
        self._hold_for_chunked()
        return result

    def _stage(self, step: int, *, blocking: bool) -> _TorchSave:
        # The small state first: once the copies below have started, the copier thread competes
        # for the GIL with each of its Python calls (RNG, scheduler, sampler).
        small = self._small_state(step)
        tree = self._targets()
        late = None
        if self.config.overlap_staging and not blocking:
            ptrs = self._late_pointers(tree)
            late = lambda t: t.data_ptr() in ptrs  # noqa: E731
        copy_cpu = not blocking
        need = self._stager.stage_bytes(tree, copy_cpu=copy_cpu)
        budget = staging_budget(self.config.staging_budget_bytes, held=self._stager.held_bytes)
        staged: Staged
        if need <= budget:
            self._stager.drop_chunk_buffer()
            staged = self._stager.stage(tree, late=late, copy_cpu=copy_cpu)
        else:
            log.info(
                "kubeckpt: staging %d bytes in chunks: the staging budget is %d bytes",
                need,
                budget,
            )
            staged = self._stager.stage_chunked(tree, budget, late=late, copy_cpu=copy_cpu)
            self._chunk_hold = late is None and not blocking
        self._staged = staged
        return _TorchSave(self, staged, small)

    def _hold_for_chunked(self) -> None:
        """A chunked save whose copies the optimizer's pre-step hook does not wait for (staging
        not overlapped): training waits here until the writer has copied the state."""
        if not self._chunk_hold:
            return
        self._chunk_hold = False
        staged = self._staged
        if isinstance(staged, Chunked) and self._ckpt.session.busy:
            t0 = time.monotonic()
            staged.wait_before_update()
            self._ckpt.session.add_stall(time.monotonic() - t0)

    def _format(self, tier: Tier) -> str:
        return "dcp" if tier.name == "persistent" and self.world_size > 1 else "plain"

    def _manifest_extra(self, tier: Tier, reports: list[Report]) -> dict[str, Any]:
        return {
            "kubeckpt": {
                "format": self._format(tier),
                "ranks": sorted(r.rank for r in reports),
                "torch": torch.__version__,
            }
        }

    def _late_pointers(self, tree: dict[str, Any]) -> set[int]:
        """Storage of tensors only optimizer.step() changes: parameters and optimizer state."""
        ptrs = {local_tensor(p).data_ptr() for p in self.model.parameters()}
        for _, t in iter_tensors(tree.get("optim", {}).get("state", {})):
            ptrs.add(local_tensor(t).data_ptr())
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
        before_update(self._stop, self._ckpt.session, self._staged)

    def _write_dcp_rank_files(
        self, directory: Path, small: dict[str, Any], written: list[plain.WrittenFile]
    ) -> list[plain.WrittenFile]:
        buf = io.BytesIO()
        torch.save({"format": "kubeckpt-rank-state/1", "state": small}, buf)
        name = plain.state_file(self.rank)
        write_durable(directory / name, buf.getbuffer())
        others = {plain.state_file(r) for r in range(self.world_size) if r != self.rank}
        others |= {INCOMPLETE_SENTINEL, MANIFEST_FILE}
        names = dcp_format.owned_files(directory, self.rank, others)
        names = [n for n in names if n != name]
        # The shards and .metadata were hashed as DCP wrote them: no second read of the checkpoint.
        return [
            *dcp_format.hash_files(directory, names, known=written),
            *dcp_format.hash_files(directory, [name]),
        ]

    # ------------------------------------------------------------------ progress

    def _scalars(self, loss: Any, learning_rate: Any) -> tuple[Any, Any]:
        if learning_rate is None and self.optimizers:
            learning_rate = self.optimizers[0].param_groups[0].get("lr")
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float().item()
        if isinstance(learning_rate, torch.Tensor):
            learning_rate = learning_rate.item()
        return loss, learning_rate
