"""The HF Trainer's checkpoint, staged to CPU memory on the training thread and written by another.

`stage(trainer, output_dir)` does, on the training thread, what `Trainer._save_checkpoint` does
except writing: the same bookkeeping (`store_flos`, best-checkpoint lookup, stateful callbacks) and
a CPU copy of everything the Trainer would write, in its layout and under its names:

- rank 0 (`args.should_save`): the model through its own `save_pretrained` (so PEFT models write
  their adapters, tied weights stay tied) given a staged state_dict, optimizer.pt, scheduler.pt,
  scaler.pt, trainer_state.json, training_args.bin and the processing class;
- every rank: its RNG state, `rng_state.pth` or `rng_state_<rank>.pth`.

`Snapshot.persist()` then writes and fsyncs them, on the save thread. The files are the ones the
Trainer's own save writes (tests compare them byte for byte), so a plain
`Trainer.train(resume_from_checkpoint=...)` resumes from them.

Staging copies what training changes: trainable parameters, buffers, optimizer and scaler state.
Frozen parameters (a PEFT base model) are passed by reference: only `optimizer.step()` changes
parameters, and it never touches frozen ones. Copies go into CPU buffers kept from one save to the
next (the first copy into fresh memory pays a page fault per page); at most one save is in flight,
so a buffer is never refilled while it is being written.

Staging is bounded by the same budget as torch's (staging_budget.py). optimizer.pt is one pickle
that must stay the Trainer's own byte for byte, so it cannot be written in chunks as torch's plain
format is; instead a save whose copy does not fit is not copied (`Staging`, `choose`): with
HELD, trainable parameters and optimizer state (which only `optimizer.step()` changes) are
written from their own memory and the next optimizer step waits until every tier is written,
while what forward changes (buffers) and the small scheduler/scaler state are still copied; with
BLOCKING (even that does not fit, or no pre-step hook to wait in) nothing is copied and training
waits for the whole write. Either way the files are the same bytes.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import os
import random
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Trainer
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy
from transformers.training_args import ParallelMode

from ..fsutil import fsync_dir, fsync_file

TRAINING_ARGS_NAME = "training_args.bin"
TRAINER_STATE_NAME = "trainer_state.json"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"
SAFE_WEIGHTS_NAME = "model.safetensors"


# What staging does instead of these; a Trainer that changes any of them keeps its own save.
_SAVE_METHODS = (
    "_save_checkpoint",
    "save_model",
    "_save",
    "_save_optimizer_and_scheduler",
    "_save_scaler",
    "_save_rng_state",
)


def async_unsupported(trainer: Any) -> str | None:
    """Why the Trainer's save cannot be staged here (it stays synchronous), or None.

    FSDP and DeepSpeed save sharded state through their own collectives; XLA, SageMaker MP and the
    other accelerators have RNG and save paths of their own; a push to the Hub reads the files the
    moment they are written, and load_best_model_at_end reads one back as soon as training ends; a
    model sharded at load time gathers its state with collectives.
    """
    from transformers.utils import (
        is_sagemaker_mp_enabled,
        is_torch_hpu_available,
        is_torch_mlu_available,
        is_torch_musa_available,
        is_torch_npu_available,
        is_torch_xla_available,
    )

    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP"
    if getattr(trainer, "is_deepspeed_enabled", False):
        return "DeepSpeed"
    if getattr(trainer, "is_distributed_loading_by_transformers", False):
        return "a model sharded at load time"
    if trainer.args.push_to_hub:
        return "push_to_hub"
    if trainer.args.load_best_model_at_end:
        return "load_best_model_at_end"  # the Trainer reads the best checkpoint back at the end
    for name in _SAVE_METHODS:
        # A subclass's own save (TRL's trainers, ...) would be bypassed by staging: keep it.
        own = getattr(type(trainer), name, None)
        if own is not getattr(Trainer, name) or name in vars(trainer):
            return f"{type(trainer).__name__} overrides {name}"
    for name, available in (
        ("XLA", is_torch_xla_available),
        ("SageMaker MP", is_sagemaker_mp_enabled),
        ("NPU", is_torch_npu_available),
        ("HPU", is_torch_hpu_available),
        ("MLU", is_torch_mlu_available),
        ("MUSA", is_torch_musa_available),
    ):
        if available():
            return name
    return None


class Staging(enum.Enum):
    """How one save gets its state to the writer (module docstring)."""

    WHOLE = "whole"  # everything copied: training goes on at once (within the budget)
    HELD = "held"  # parameters and optimizer state written in place; the next update waits
    BLOCKING = "blocking"  # nothing copied: training waits until the save is durable


@dataclass(frozen=True)
class StagingPlan:
    """The decision for one save, with the figures it was made from (bytes)."""

    mode: Staging
    need: int  # a whole copy
    forward_changed: int  # what HELD still copies: buffers, scheduler and scaler state
    budget: int

    @property
    def staged_bytes(self) -> int:
        """What the stager copies under this plan."""
        return {Staging.WHOLE: self.need, Staging.HELD: self.forward_changed}.get(self.mode, 0)

    def note(self) -> str | None:
        """Why the save is not async as usual (None: it is), for logs and the save's result."""
        if self.mode is Staging.WHOLE:
            return None
        held = (
            "the next optimizer step waits until it is written"
            if self.mode is Staging.HELD
            else "training waits until it is written"
        )
        return (
            f"the state ({self.need} bytes) exceeds the staging budget ({self.budget} bytes): "
            f"parameters and optimizer state are written from training memory and {held}"
        )


def choose(need: int, forward_changed: int, budget: int, *, can_hold: bool) -> StagingPlan:
    """WHOLE when a whole copy fits the budget; else HELD when what forward changes fits and the
    optimizer's pre-step hook can hold the next update; else BLOCKING."""
    if need <= budget:
        mode = Staging.WHOLE
    elif forward_changed <= budget and can_hold:
        mode = Staging.HELD
    else:
        mode = Staging.BLOCKING
    return StagingPlan(mode, need, forward_changed, budget)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _key(t: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a tensor view: equal keys are the same memory (tied weights)."""
    return (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
        t.device,
    )


class Stager:
    """CPU copies into buffers reused from one save to the next."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self.bytes_copied = 0
        self._warming: threading.Thread | None = None
        # (source, buffer) pairs copied on a thread while the next forward/backward runs, when
        # staging overlaps (CPU tensors only optimizer.step() changes: parameters, its state).
        self._late: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.overlap = False  # set by the callback for each save it stages
        self.plan: StagingPlan | None = None  # likewise (`choose`); None: WHOLE
        self.peak_bytes = 0  # the most the buffers have held at once (tests, logs)

    @property
    def mode(self) -> Staging:
        return Staging.WHOLE if self.plan is None else self.plan.mode

    @property
    def held_bytes(self) -> int:
        """Host memory the buffers keep for the next save (counted in the process's use)."""
        self._wait_warm()
        return sum(_nbytes(b) for b in self._buffers.values())

    def _allocated(self, name: tuple[Any, ...], buf: torch.Tensor) -> None:
        self._buffers[name] = buf
        self.peak_bytes = max(self.peak_bytes, sum(_nbytes(b) for b in self._buffers.values()))

    def sizes(self, trainer: Any) -> tuple[int, int]:
        """(bytes a whole copy stages, bytes of it forward may change) for this rank's save."""
        if not trainer.args.should_save:
            return 0, 0  # other ranks stage their RNG state only
        target, raw = _supported_model(trainer)
        model = trainer.model if raw else target
        trained = {_key(p.detach()) for p in model.parameters() if p.requires_grad}
        need = changed = 0
        for _, t in self._model_plan(model):
            need += _nbytes(t)
            changed += 0 if _key(t.detach()) in trained else _nbytes(t)
        if not trainer.args.save_only_model:
            optim = self._tree_plan(("optim",), _sd(trainer.optimizer), {})
            need += sum(_nbytes(t) for _, t in optim)
            small = [("sched", _sd(trainer.lr_scheduler))]
            scaler = getattr(trainer.accelerator, "scaler", None)
            if scaler is not None:
                small.append(("scaler", scaler.state_dict()))
            for name, tree in small:
                n = sum(_nbytes(t) for _, t in self._tree_plan((name,), tree, {}))
                need += n
                changed += n
        return need, changed

    def drop_live(self, model: torch.nn.Module) -> None:
        """Before a save that is not staged whole: give up the buffers of what it will not copy
        (a second full copy is what the budget rules out); HELD keeps those it still fills."""
        self._wait_warm()
        if self.mode is Staging.BLOCKING:
            self._buffers.clear()
        elif self.mode is Staging.HELD:
            trained = {_key(p.detach()) for p in model.parameters() if p.requires_grad}
            names = {("model", k) for k, v in model.state_dict().items() if _key(v) in trained}
            for name in [n for n in self._buffers if n[0] == "optim" or n in names]:
                del self._buffers[name]

    def warm(self, trainer: Any) -> None:
        """Allocate and touch the buffers for the model and optimizer state on a background thread
        (the training thread only lists them). The first copy into fresh memory pays a page fault
        per page, ~10x the copy itself, which would otherwise land in the first save's stall."""
        if not trainer.args.should_save:
            return  # only rank 0 stages the model and optimizer
        target, raw = _supported_model(trainer)
        tensors = self._model_plan(trainer.model if raw else target)
        if not trainer.args.save_only_model:
            tensors += list(self._tree_plan(("optim",), _sd(trainer.optimizer), {}))
        plan = [(name, (tuple(t.shape), t.dtype, t.is_cuda)) for name, t in tensors]

        def run() -> None:
            for name, (shape, dtype, cuda) in plan:
                if name not in self._buffers:
                    buf = torch.empty(shape, dtype=dtype, pin_memory=cuda).fill_(0)
                    self._allocated(name, buf)

        # Not a daemon: the interpreter waits for it at exit. A daemon thread still filling
        # buffers then made torch abort the process (SIGABRT, exit 134) after a short run.
        self._warming = threading.Thread(target=run, name="kubeckpt-warm")
        self._warming.start()

    def _wait_warm(self) -> None:
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def _model_plan(self, model: torch.nn.Module) -> list[tuple[tuple[Any, ...], torch.Tensor]]:
        frozen = {_key(p.detach()) for p in model.parameters() if not p.requires_grad}
        seen: set = set()
        plan = []
        for k, v in model.state_dict().items():
            if isinstance(v, torch.Tensor) and _key(v) not in frozen and _key(v) not in seen:
                seen.add(_key(v))
                plan.append((("model", k), v))
        return plan

    def _tree_plan(self, path: tuple[Any, ...], o: Any, seen: dict) -> Any:
        if isinstance(o, torch.Tensor):
            if _key(o) not in seen:
                seen[_key(o)] = True
                yield path, o
        elif isinstance(o, dict):
            for k, v in o.items():
                yield from self._tree_plan((*path, k), v, seen)
        elif isinstance(o, list | tuple):
            for i, v in enumerate(o):
                yield from self._tree_plan((*path, i), v, seen)

    def _copy(
        self, name: tuple[Any, ...], src: torch.Tensor, memo: dict, late: bool = False
    ) -> torch.Tensor:
        src = src.detach()
        key = _key(src)
        if key in memo:  # the same memory under another name: keep it shared
            return memo[key]
        buf = self._buffers.get(name)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            self._buffers.pop(name, None)  # the old one is not counted beside its replacement
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
            self._allocated(name, buf)
        if late and self._late is not None and not src.is_cuda:
            self._late.append((src, buf))
        else:
            buf.copy_(src, non_blocking=src.is_cuda)
        self.bytes_copied += src.numel() * src.element_size()
        memo[key] = buf
        return buf

    def tree(
        self,
        name: str,
        obj: Any,
        memo: dict | None = None,
        *,
        late: bool = False,
        live: bool = False,
    ) -> Any:
        """A deep copy of nested dicts/lists/tuples with every tensor copied to CPU (`late`:
        copied by `start_late`'s thread, when staging overlaps). `live`: `obj` itself, a fresh
        state_dict written from training memory (a save not staged whole)."""
        self._wait_warm()
        if live:
            return obj
        memo = {} if memo is None else memo

        def walk(path: tuple[Any, ...], o: Any) -> Any:
            if isinstance(o, torch.Tensor):
                return self._copy(path, o, memo, late)
            if isinstance(o, dict):
                out = {k: walk((*path, k), v) for k, v in o.items()}
                return out if type(o) is dict else type(o)(out)  # OrderedDict pickles apart
            if isinstance(o, list):
                return [walk((*path, i), v) for i, v in enumerate(o)]
            if isinstance(o, tuple) and not hasattr(o, "_fields"):
                return tuple(walk((*path, i), v) for i, v in enumerate(o))
            return copy.deepcopy(o)

        return walk((name,), obj)

    def model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """model.state_dict() with trainable parameters and buffers copied, frozen ones as-is."""
        self._wait_warm()
        frozen = {_key(p.detach()) for p in model.parameters() if not p.requires_grad}
        trained = {_key(p.detach()) for p in model.parameters() if p.requires_grad}
        # HELD: trainable parameters are written in place (the next update waits); BLOCKING: all.
        live = frozen | trained if self.mode is Staging.HELD else frozen
        memo: dict = {}
        staged = {}
        for k, v in model.state_dict().items():
            if isinstance(v, torch.Tensor) and (
                self.mode is Staging.BLOCKING or _key(v.detach()) in live
            ):
                staged[k] = v.detach()  # never changed by the optimizer, or not until written
            elif isinstance(v, torch.Tensor):
                # Parameters change only in optimizer.step(): they may be copied late. Buffers
                # (forward changes them) are copied now.
                late = _key(v.detach()) in trained
                staged[k] = self._copy(("model", k), v, memo, late)
            else:
                staged[k] = copy.deepcopy(v)
        return staged

    def begin_late(self) -> None:
        """From here to `start_late`, copies marked late are only listed."""
        self._late = []

    def start_late(self) -> LateCopy | None:
        """Copy what was listed on a thread, while training goes on; None if nothing was."""
        pairs, self._late = self._late, None
        return LateCopy(pairs) if pairs else None

    def synchronize(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non_blocking device-to-host copies have landed


class LateCopy:
    """Copies made on a thread while the next forward/backward runs; the next optimizer step
    (the callback's pre-step hook) and the writer wait for them."""

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(pairs,), name="kubeckpt-stage", daemon=True
        )
        self.thread.start()

    def _run(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        try:
            for src, buf in pairs:
                buf.copy_(src)
        except BaseException as e:  # reported by wait() on the writer thread
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"staging the checkpoint failed: {self.error}") from self.error


@dataclass
class Snapshot:
    """One rank's share of one checkpoint, in CPU memory."""

    output_dir: str
    model: Any = None  # what `save_pretrained` is called on, with `model_state`
    model_state: dict[str, torch.Tensor] | None = None
    raw_weights: bool = False  # not a PreTrainedModel/PeftModel: safetensors of its state_dict
    processing: Any = None  # tokenizer / processor: its own save_pretrained
    torch_files: list[tuple[str, Any]] = field(default_factory=list)  # torch.save(obj, name)
    blobs: list[tuple[str, bytes]] = field(default_factory=list)  # bytes staged already
    bytes_staged: int = 0
    late: LateCopy | None = None  # parameter and optimizer copies still being made
    # Not staged whole (HELD/BLOCKING): set once the writer is done with the live tensors.
    released: threading.Event | None = None
    staging_note: str | None = None  # why not (StagingPlan.note)

    def wait_copies(self) -> None:
        if self.late is not None:
            self.late.wait()

    def persist(self) -> list[str]:
        """Write and fsync every file; the names written. Errors (ENOSPC) propagate."""
        self.wait_copies()
        out = Path(self.output_dir)
        os.makedirs(out, exist_ok=True)
        before = {p.name for p in out.iterdir()}
        if self.model_state is not None:
            if self.raw_weights:
                import safetensors.torch

                safetensors.torch.save_file(
                    self.model_state, str(out / SAFE_WEIGHTS_NAME), metadata={"format": "pt"}
                )
            else:
                self.model.save_pretrained(
                    str(out), state_dict=self.model_state, is_main_process=True
                )
            if self.processing is not None:
                self.processing.save_pretrained(str(out))
        for name, obj in self.torch_files:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the Trainer re-issues only its own PT warnings
                torch.save(obj, out / name)
        for name, data in self.blobs:
            with open(out / name, "wb") as f:
                f.write(data)
        written = sorted({p.name for p in out.iterdir() if p.is_file()} - before)
        if self.model_state is not None:
            # save_pretrained may overwrite files it wrote before, so fsync the whole directory.
            written = sorted(p.name for p in out.iterdir() if p.is_file())
        for name in written:
            fsync_file(out / name)
        fsync_dir(out)
        return written


def _rng_state(trainer: Any) -> dict[str, Any]:
    """What `Trainer._save_rng_state` saves (CPU and CUDA; other devices are excluded above)."""
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        if trainer.args.parallel_mode == ParallelMode.DISTRIBUTED:
            states["cuda"] = torch.cuda.random.get_rng_state_all()
        else:
            states["cuda"] = torch.cuda.random.get_rng_state()
    return states


def _supported_model(trainer: Any) -> tuple[Any, bool]:
    """(the object whose save_pretrained the Trainer's `_save` would call, raw-safetensors?)."""
    from transformers import PreTrainedModel
    from transformers.utils import is_peft_available

    classes: tuple[type, ...] = (PreTrainedModel,)
    if is_peft_available():
        from peft import PeftModel

        classes = (PreTrainedModel, PeftModel)
    if isinstance(trainer.model, classes):
        return trainer.model, False
    unwrapped = trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False)
    if isinstance(unwrapped, classes):
        return unwrapped, False
    return None, True


def stage(trainer: Any, stager: Stager, step: int, *, collectives: bool = True) -> Snapshot:
    """`Trainer._save_checkpoint` up to the writes: bookkeeping done, the files' content staged.

    `collectives=False`: from the stop watcher's thread while the training thread is away from a
    step boundary (evaluating): nothing that would join the training thread's collectives (the
    FLOs count is not gathered; the best checkpoint is not looked up).

    With `stager.overlap`, parameters and optimizer state (CPU) are copied on a thread while the
    next forward/backward runs (`Snapshot.late`); the caller makes the next optimizer step wait."""
    if trainer.hp_search_backend is None and collectives:
        trainer.store_flos()  # a collective in DDP: every rank is here, as in the Trainer's save
    run_dir = trainer._get_output_dir(trial=None)
    output_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
    args = trainer.args
    snap = Snapshot(output_dir=output_dir)
    before = stager.bytes_copied
    if stager.overlap and collectives:
        stager.begin_late()

    if stager.mode is not Staging.WHOLE:
        snap.released = threading.Event()
        snap.staging_note = stager.plan.note() if stager.plan is not None else None

    if args.should_save:
        target, raw = _supported_model(trainer)
        if stager.mode is not Staging.WHOLE:
            stager.drop_live(trainer.model if raw else target)
        snap.model = target
        snap.raw_weights = raw
        snap.model_state = stager.model_state(trainer.model if raw else target)
        if trainer.processing_class is not None:
            snap.processing = trainer.processing_class
        elif getattr(trainer.data_collator, "tokenizer", None) is not None:
            snap.processing = trainer.data_collator.tokenizer
        # A copy, saved to its file by name on the save thread: torch.save names the archive
        # inside after the file ("training_args/..."), so bytes saved to a buffer would differ.
        snap.torch_files.append((TRAINING_ARGS_NAME, copy.deepcopy(args)))

    if (
        collectives
        and args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST)
        and trainer.state.best_global_step
    ):
        if args.parallel_mode == ParallelMode.DISTRIBUTED:
            torch.distributed.barrier()  # as the Trainer does before looking for the best one
        best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.best_global_step}")
        if os.path.exists(best):
            trainer.state.best_model_checkpoint = best

    if not args.save_only_model:
        if args.should_save:
            live = stager.mode is not Staging.WHOLE
            optim = stager.tree("optim", _sd(trainer.optimizer), late=True, live=live)
            snap.torch_files.append((OPTIMIZER_NAME, optim))
            blocking = stager.mode is Staging.BLOCKING
            sched = stager.tree("sched", _sd(trainer.lr_scheduler), live=blocking)
            snap.torch_files.append((SCHEDULER_NAME, sched))
            scaler = getattr(trainer.accelerator, "scaler", None)
            if scaler is not None:
                scaler_state = stager.tree("scaler", scaler.state_dict(), live=blocking)
                snap.torch_files.append((SCALER_NAME, scaler_state))
        rng = "rng_state.pth" if args.world_size <= 1 else f"rng_state_{args.process_index}.pth"
        snap.torch_files.append((rng, _rng_state(trainer)))

    if args.should_save:
        callbacks = [*trainer.callback_handler.callbacks, trainer.control]
        for cb in [cb for cb in callbacks if isinstance(cb, ExportableState)]:
            name, cb_state = cb.__class__.__name__, cb.state()
            if isinstance(trainer.state.stateful_callbacks[name], list):
                trainer.state.stateful_callbacks[name].append(cb_state)
            else:
                trainer.state.stateful_callbacks[name] = cb_state
        # TrainerState.save_to_json's exact text
        text = json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n"
        snap.blobs.append((TRAINER_STATE_NAME, text.encode("utf-8")))

    snap.late = stager.start_late()
    stager.synchronize()
    snap.bytes_staged = stager.bytes_copied - before
    return snap


def _sd(obj: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return obj.state_dict()
