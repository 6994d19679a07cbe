"""Resuming an HF Trainer checkpoint on another number of ranks: allowed where the Trainer resumes
it exactly, a clear error where it would not.

How the Trainer (transformers 5.x, `_init_training_state` and `_run_epoch`) resumes: it loads the
model, optimizer, scheduler and scaler (a DDP checkpoint holds them whole; FSDP's sharded one is
DCP, resharded on load), then computes from the saved `global_step` alone, with the *new* job's
dataloader, `epochs_trained = global_step // steps_per_epoch` and skips
`(global_step % steps_per_epoch) * gradient_accumulation_steps` batches on every rank. The train
sampler's order depends on the seed and the epoch only (accelerate's seedable RandomSampler, or
the sequential one), and accelerate deals its batches to the ranks in turn (batch i to rank
i % W). So after s optimizer steps of an epoch exactly its first s * T samples are consumed, T
being the total train batch size (per-device batch x gradient accumulation x data-parallel world
size), and one optimizer step takes the next T samples, whatever the world size.

Hence: on another world size the Trainer resumes exactly (every not-yet-consumed sample of the
epoch once, in the same order, each later step over the same samples as before; model, optimizer
and scheduler as saved) if and only if T and the number of steps per epoch are unchanged; for
example 2 ranks x batch 8 resumed on 4 ranks x batch 4, or on 1 rank with
gradient_accumulation_steps doubled. The per-rank RNG state of a rank that did not exist is not
restored (the Trainer logs it). Otherwise it would skip the wrong number of samples (s * T' for
s * T) and count epochs differently: `check_resume` raises `WorldSizeError` before `train()`
loads anything, naming both world sizes and how to resume exactly.

Not exact on another world size whatever T: `train_sampling_strategy` "group_by_length" (mega-
batches of per-device batch x accumulation) or "batch_rebalance" (balanced per data-parallel
rank), a dataset without a length (the position is not counted in samples), and DeepSpeed ZeRO
checkpoints (partitioned per rank; DeepSpeed's universal checkpoint reshards them).
`ignore_data_skip=True` tells the Trainer not to restore the data position at all: then no check.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import read_manifest

log = logging.getLogger(__name__)

_RNG_FILE = re.compile(r"rng_state_(\d+)\.pth")
# Sampling strategies whose order is the same on any world size for the same total batch.
_ORDER_KEEPING = {"random", "sequential"}


class WorldSizeError(ValueError):
    """The HF Trainer would not resume this checkpoint exactly on this world size."""


@dataclass(frozen=True)
class Shape:
    """What decides which samples a step takes: per-device batch, accumulation, world size."""

    world_size: int
    batch_size: int  # per process (the Trainer's train_batch_size)
    accumulation: int
    # world_size / data-parallel size (tensor, context, sequence parallelism; 1 without them)
    non_data_parallel: int = 1

    @property
    def total(self) -> int:
        return self.batch_size * self.accumulation * (self.world_size // self.non_data_parallel)

    def steps_per_epoch(self, samples: int, drop_last: bool) -> int:
        """The Trainer's `num_update_steps_per_epoch` for `samples` samples (accelerate's
        BatchSamplerShard: even batches, or the remainder dropped)."""
        ranks = self.world_size // self.non_data_parallel
        if drop_last:
            batches = samples // self.batch_size // ranks
        else:
            batches = math.ceil(math.ceil(samples / self.batch_size) / ranks)
        return max(math.ceil(batches / self.accumulation), 1)


def reasons_not_exact(
    old: Shape,
    new: Shape,
    *,
    samples: int | None,
    drop_last: bool = False,
    sampling: str = "random",
    deepspeed: bool = False,
    universal: bool = False,
) -> list[str]:
    """Why resuming a checkpoint of `old` with `new` would not be exact ([] when it would)."""
    reasons = []
    if deepspeed and not universal:
        reasons.append(
            "DeepSpeed ZeRO checkpoints are partitioned per rank: convert it with DeepSpeed's "
            'ds_to_universal.py and set "checkpoint": {"load_universal": true}'
        )
    if sampling not in _ORDER_KEEPING:
        reasons.append(
            f"train_sampling_strategy={sampling!r} orders samples by per-device batch or rank"
        )
    if samples is None:
        reasons.append("the train dataset has no length, so its position is not counted")
    if old.total != new.total:
        reasons.append(
            f"the total train batch size changes from {old.total} "
            f"({_describe(old)}) to {new.total} ({_describe(new)})"
        )
    elif samples is not None:
        old_steps = old.steps_per_epoch(samples, drop_last)
        new_steps = new.steps_per_epoch(samples, drop_last)
        if old_steps != new_steps:
            reasons.append(f"steps per epoch change from {old_steps} to {new_steps}")
    return reasons


def _describe(shape: Shape) -> str:
    return (
        f"{shape.batch_size} per device x {shape.accumulation} accumulation x "
        f"{shape.world_size // shape.non_data_parallel} data-parallel ranks"
    )


def _advice(old: Shape, new: Shape) -> str:
    ranks = new.world_size // new.non_data_parallel
    ways = []
    if old.total % (new.batch_size * ranks) == 0:
        ways.append(f"gradient_accumulation_steps={old.total // (new.batch_size * ranks)}")
    if old.total % (new.accumulation * ranks) == 0:
        ways.append(f"per_device_train_batch_size={old.total // (new.accumulation * ranks)}")
    how = f" (e.g. {' or '.join(ways)})" if ways else ""
    return (
        f"keep per_device_train_batch_size x gradient_accumulation_steps x data-parallel ranks "
        f"at {old.total}{how}, or resume with {old.world_size} ranks"
    )


# ------------------------------------------------------------------------ reading the checkpoint


def saved_world_size(checkpoint: str | os.PathLike[str]) -> int | None:
    """How many ranks wrote the checkpoint: the kubeckpt manifest's world size, else the
    Trainer's RNG files (`rng_state_<rank>.pth` per rank, `rng_state.pth` for one process)."""
    path = Path(checkpoint)
    try:
        return int(read_manifest(path).world_size)
    except (OSError, ValueError):
        pass
    try:
        names = os.listdir(path)
    except OSError:
        return None
    ranks = [int(m.group(1)) for m in map(_RNG_FILE.fullmatch, names) if m]
    if ranks:
        return max(ranks) + 1
    return 1 if "rng_state.pth" in names else None


class _Stub:
    """Stands in for every class in the pickle: records state, runs no code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple):  # (dict, slots)
            for part in state:
                if isinstance(part, dict):
                    self.__dict__.update(part)
        elif isinstance(state, dict):
            self.__dict__.update(state)


class _StubUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return type(name, (_Stub,), {})

    def persistent_load(self, pid: Any) -> Any:
        return None  # a tensor's storage: not needed here


def saved_training_args(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """The fields of the checkpoint's `training_args.bin` (torch.save of TrainingArguments), read
    without running any code from it: every class is replaced by a stub. {} if unreadable."""
    try:
        with zipfile.ZipFile(Path(checkpoint, "training_args.bin")) as zf:
            name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
            obj = _StubUnpickler(zf.open(name)).load()
    except (OSError, StopIteration, zipfile.BadZipFile, pickle.UnpicklingError, EOFError) as e:
        log.debug("kubeckpt: cannot read training_args.bin: %s", e)
        return {}
    except Exception as e:  # a malformed pickle: treat as absent
        log.debug("kubeckpt: cannot read training_args.bin: %s", e)
        return {}
    fields = getattr(obj, "__dict__", None)
    return dict(fields) if isinstance(fields, dict) else {}


# ------------------------------------------------------------------------ the check


def check_resume(trainer: Any, checkpoint: str | os.PathLike[str] | bool | None) -> None:
    """Raise WorldSizeError if `trainer.train(resume_from_checkpoint=checkpoint)` would resume a
    checkpoint written by another number of ranks inexactly (see the module docstring). Nothing
    to check (no checkpoint, the same world size, `ignore_data_skip`, a step-0 checkpoint, a
    checkpoint whose world size is unknown): returns."""
    args = trainer.args
    if checkpoint is None or checkpoint is False:
        return
    if checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        checkpoint = get_last_checkpoint(args.output_dir)
        if checkpoint is None:
            return
    old_world = saved_world_size(checkpoint)
    new_world = max(1, int(args.world_size))
    if old_world is None or old_world == new_world:
        return
    if args.ignore_data_skip:
        log.warning(
            "kubeckpt: resuming a checkpoint of %d ranks on %d with ignore_data_skip: the data "
            "position is not restored",
            old_world,
            new_world,
        )
        return
    try:
        state = json.loads(Path(checkpoint, "trainer_state.json").read_text())
    except (OSError, ValueError):
        return  # not a Trainer checkpoint: the Trainer says so itself
    if int(state.get("global_step") or 0) == 0:
        return
    new = _new_shape(trainer, new_world)
    saved = saved_training_args(checkpoint)
    accumulation = saved.get("gradient_accumulation_steps")
    if not isinstance(accumulation, int) or accumulation < 1:
        log.warning(
            "kubeckpt: the checkpoint's gradient_accumulation_steps is unknown (training_args.bin "
            "unreadable); taking it to be this run's %d",
            new.accumulation,
        )
        accumulation = new.accumulation
    old = Shape(
        world_size=old_world,
        batch_size=int(state.get("train_batch_size") or new.batch_size),
        accumulation=accumulation,
        non_data_parallel=new.non_data_parallel,  # taken to be unchanged
    )
    dataset = getattr(trainer, "train_dataset", None)
    try:
        samples = len(dataset) if dataset is not None else None
    except TypeError:
        samples = None
    ds_config = getattr(getattr(args, "hf_deepspeed_config", None), "config", None) or {}
    reasons = reasons_not_exact(
        old,
        new,
        samples=samples,
        drop_last=bool(args.dataloader_drop_last),
        sampling=_sampling(args),
        deepspeed=bool(getattr(trainer, "is_deepspeed_enabled", False)),
        universal=bool(ds_config.get("checkpoint", {}).get("load_universal", False)),
    )
    if reasons:
        raise WorldSizeError(
            f"checkpoint {checkpoint} was written by {old_world} ranks and this job has "
            f"{new_world}: the HF Trainer would not resume it exactly ({'; '.join(reasons)}). "
            f"To resume exactly, {_advice(old, new)}; to resume anyway without restoring the "
            "data position, set TrainingArguments(ignore_data_skip=True)."
        )
    log.info(
        "kubeckpt: resuming a checkpoint of %d ranks on %d: the same total batch (%d), exact",
        old_world,
        new_world,
        new.total,
    )


def _new_shape(trainer: Any, world: int) -> Shape:
    args = trainer.args
    batch = int(getattr(trainer, "_train_batch_size", None) or args.train_batch_size)
    accumulation = int(args.gradient_accumulation_steps)
    non_dp = 1
    total = getattr(trainer, "get_total_train_batch_size", None)
    if callable(total):
        try:
            non_dp = max(1, (batch * accumulation * world) // int(total(args)))
        except Exception:  # an older Trainer, or one not fully set up
            non_dp = 1
    return Shape(world, batch, accumulation, non_dp)


def _sampling(args: Any) -> str:
    strategy = getattr(args, "train_sampling_strategy", None)
    if strategy is None:  # transformers < 5: a flag
        return "group_by_length" if getattr(args, "group_by_length", False) else "random"
    return str(getattr(strategy, "value", strategy))
