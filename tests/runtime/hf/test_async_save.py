"""Async saves of the HF integration (single process): the files are the Trainer's own byte for byte
(full model and PEFT adapters), training goes on while they are written, a checkpoint is finalized
only after its files are durable, and a failed write is reported without stopping training."""

from __future__ import annotations

import errno
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from test_callback import _args, _env, _trainer
from test_callback import reference as reference  # the module-scoped fixture
from tiny_hf import TokenDataset, tiny_gpt2
from transformers import Trainer, TrainerCallback

from trainer_runtime import layout
from trainer_runtime.config import Config
from trainer_runtime.contract import INCOMPLETE_SENTINEL
from trainer_runtime.hf import async_save, kubeckpt_trainer, resume_checkpoint


def _lora_trainer(tmp: Path) -> Trainer:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=2, target_modules=["c_attn"], lora_dropout=0.0)
    model = get_peft_model(tiny_gpt2(), lora)
    return Trainer(
        model=model,
        args=_args(tmp / "unused-output"),
        train_dataset=TokenDataset(),
    )


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "manifest.json"}


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_async_files_are_the_trainers_own_byte_for_byte(tmp_path, kind):
    make = _trainer if kind == "full" else _lora_trainer
    root = tmp_path / "ckpt"
    saved = {}
    for mode in ("false", "true"):  # the Trainer's own (synchronous) save first, then ours
        trainer = kubeckpt_trainer(
            make(tmp_path), Config.from_env(_env(tmp_path, KUBECKPT_ASYNC_SAVE=mode))
        )
        assert trainer.kubeckpt.async_save is (mode == "true")
        trainer.train()
        assert [(e.step, e.complete) for e in layout.scan(root)] == [(4, True), (8, True)]
        saved[mode] = {s: _files(root / f"checkpoint-{s}") for s in (4, 8)}
        shutil.rmtree(root)
    for step in (4, 8):
        sync, ours = saved["false"][step], saved["true"][step]
        assert sorted(ours) == sorted(sync)
        weights = "model.safetensors" if kind == "full" else "adapter_model.safetensors"
        assert {weights, "optimizer.pt", "rng_state.pth", "trainer_state.json"} <= set(ours)
        for name in sync:
            assert ours[name] == sync[name], f"checkpoint-{step}/{name} differs"


class _Gate:
    """Holds the save thread's writes until released, recording what training did meanwhile."""

    def __init__(self, monkeypatch, step: int) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        persist = async_save.Snapshot.persist

        def held(snapshot):
            if not snapshot.output_dir.endswith(f"checkpoint-{step}"):
                return persist(snapshot)
            self.entered.set()
            assert self.release.wait(60), "never released"
            return persist(snapshot)

        monkeypatch.setattr(async_save.Snapshot, "persist", held)


def test_training_goes_on_while_the_save_is_written(tmp_path, monkeypatch):
    gate = _Gate(monkeypatch, 4)
    root = tmp_path / "ckpt"
    seen = {}

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 6:  # two steps after the save at 4 began
                # The writer thread creates the directory and its sentinel before it writes: give
                # it the time a loaded machine may need, while training is already at step 6.
                seen["entered"] = gate.entered.wait(30)
                seen["incomplete"] = (root / "checkpoint-4" / INCOMPLETE_SENTINEL).exists()
                seen["manifest"] = (root / "checkpoint-4" / "manifest.json").exists()
                seen["files"] = sorted(p.name for p in (root / "checkpoint-4").iterdir())
                gate.release.set()

    trainer = kubeckpt_trainer(
        _trainer(tmp_path, callbacks=[Watch()]), Config.from_env(_env(tmp_path))
    )
    trainer.train()
    assert seen == {
        "entered": True,
        "incomplete": True,
        "manifest": False,
        "files": [INCOMPLETE_SENTINEL],
    }
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(4, True), (8, True)]
    progress = json.loads((tmp_path / "progress.json").read_text())["checkpointing"]
    assert progress["checkpointsCreated"] == 2
    # Training waited for the copy, not for the write: the save took longer than the stall.
    assert float(progress["lastStallSeconds"]) < float(progress["lastSaveSeconds"])


def test_failed_write_is_reported_and_training_goes_on(tmp_path, monkeypatch, reference):
    persist = async_save.Snapshot.persist

    def full_disk(snapshot):
        if snapshot.output_dir.endswith("checkpoint-4"):
            Path(snapshot.output_dir, "model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return persist(snapshot)

    monkeypatch.setattr(async_save.Snapshot, "persist", full_disk)
    trainer = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(_env(tmp_path)))
    trainer.train()
    assert trainer.state.global_step == 10
    assert trainer.kubeckpt.failed_saves == 1
    root = tmp_path / "ckpt"
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(8, True)]  # 4 removed
    checkpointing = json.loads((tmp_path / "progress.json").read_text())["checkpointing"]
    assert checkpointing["failedSaves"] == 1 and "No space" in checkpointing["lastError"]
    assert checkpointing["checkpointsCreated"] == 1

    resumed = _trainer(tmp_path)
    resumed.train(resume_from_checkpoint=resume_checkpoint(root))
    for name, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)


def test_write_killed_before_finalize_leaves_it_incomplete(tmp_path, monkeypatch):
    """A crash while the save thread writes: no manifest, the sentinel stays, resume skips it."""
    gate = _Gate(monkeypatch, 8)
    root = tmp_path / "ckpt"

    class Crash(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 9:
                raise KeyboardInterrupt  # the job dies with the save at 8 still being written

    trainer = kubeckpt_trainer(
        _trainer(tmp_path, callbacks=[Crash()]), Config.from_env(_env(tmp_path))
    )
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(4, True), (8, False)]
    assert (root / "checkpoint-8" / INCOMPLETE_SENTINEL).exists()
    assert resume_checkpoint(root) == str(root / "checkpoint-4")
    gate.release.set()


class _Bare(Trainer):
    def __init__(self, **attrs) -> None:  # no model needed to ask the question
        self.__dict__.update(attrs)


class _OwnSave(_Bare):
    def _save_rng_state(self, output_dir):  # e.g. a TRL trainer adding files of its own
        pass


@pytest.mark.parametrize(
    ("cls", "attrs", "arg", "reason"),
    [
        (_Bare, {"is_fsdp_enabled": True}, {}, "FSDP"),
        (_Bare, {"is_deepspeed_enabled": True}, {}, "DeepSpeed"),
        (_Bare, {}, {"push_to_hub": True}, "push_to_hub"),
        (_Bare, {}, {"load_best_model_at_end": True}, "load_best_model_at_end"),
        (_OwnSave, {}, {}, "_OwnSave overrides _save_rng_state"),
        (_Bare, {"_save_checkpoint": print}, {}, "_Bare overrides _save_checkpoint"),
        (_Bare, {}, {}, None),
    ],
)
def test_sharded_and_special_saves_stay_synchronous(cls, attrs, arg, reason):
    from types import SimpleNamespace

    args = SimpleNamespace(**{"push_to_hub": False, "load_best_model_at_end": False, **arg})
    trainer = cls(args=args, **attrs)
    assert async_save.async_unsupported(trainer) == reason


def test_staging_buffers_are_allocated_ahead_and_reused(tmp_path):
    """Warmed after the first step (off the training thread), then every save copies into the
    same buffers: no allocation, no page faults in the stall. Tied weights get one buffer."""
    warmed = {}

    class Snap(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                stager = trainer.kubeckpt.stager
                stager._wait_warm()
                warmed.update(stager._buffers)

    trainer = kubeckpt_trainer(
        _trainer(tmp_path, callbacks=[Snap()]), Config.from_env(_env(tmp_path))
    )
    trainer.train()
    buffers = trainer.kubeckpt.stager._buffers
    assert ("model", "transformer.wte.weight") in warmed
    assert ("model", "lm_head.weight") not in warmed  # tied to wte: staged as one tensor
    assert any(k[0] == "optim" for k in warmed)
    assert buffers.keys() == warmed.keys()
    assert all(buffers[k] is warmed[k] for k in warmed)


def test_failed_staging_fails_that_save_only(tmp_path, monkeypatch):
    stage = async_save.stage

    def broken(trainer, stager, step):
        if step == 4:
            raise RuntimeError("cannot copy")
        return stage(trainer, stager, step)

    monkeypatch.setattr(async_save, "stage", broken)
    trainer = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(_env(tmp_path)))
    trainer.train()
    assert trainer.state.global_step == 10 and trainer.kubeckpt.failed_saves == 1
    assert "cannot copy" in trainer.kubeckpt.last_error
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(8, True)]


def test_overlapped_copy_is_waited_for_by_the_next_optimizer_step(tmp_path, monkeypatch):
    """Parameters and optimizer state are copied on a thread while the next forward/backward
    runs; a copy slower than that step still holds the step-4 values, because the next
    optimizer step waits for it: the checkpoint equals the Trainer's own, byte for byte."""
    run = async_save.LateCopy._run
    slowed = []

    def slow(self, pairs):
        slowed.append(len(pairs))
        time.sleep(0.5)  # several training steps' worth
        run(self, pairs)

    root = tmp_path / "ckpt"
    trainer = kubeckpt_trainer(
        _trainer(tmp_path), Config.from_env(_env(tmp_path, KUBECKPT_ASYNC_SAVE="false"))
    )
    trainer.train()
    sync = {s: _files(root / f"checkpoint-{s}") for s in (4, 8)}
    shutil.rmtree(root)
    monkeypatch.setattr(async_save.LateCopy, "_run", slow)
    trainer = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(_env(tmp_path)))
    trainer.train()
    assert slowed and all(n > 0 for n in slowed), slowed  # the copies were overlapped
    for step in (4, 8):
        ours = _files(root / f"checkpoint-{step}")
        for name in sync[step]:
            assert ours[name] == sync[step][name], f"checkpoint-{step}/{name} differs"
