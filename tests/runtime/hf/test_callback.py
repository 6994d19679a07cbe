"""The HF Trainer integration, single process: progress, atomic periodic saves that plain HF
resumes from, incomplete checkpoints skipped and cleaned, SIGTERM -> save and stop -> exact resume.

A tiny GPT-2 built from a config, token ids fed directly: no downloads, no tokenizer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from kubeckpt_env import kubeckpt_env as _env
from tiny_hf import TokenDataset, tiny_gpt2
from transformers import (
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from trainer_runtime import layout
from trainer_runtime.config import Config
from trainer_runtime.contract import INCOMPLETE_SENTINEL
from trainer_runtime.contract.env import UNVERIFIABLE_EXIT_CODE
from trainer_runtime.hf import KubeckptCallback, kubeckpt_trainer, resume_checkpoint
from trainer_runtime.protocol.resume_outcome import ResumeRefused

STEPS = 10


def _args(out: Path, **kw) -> TrainingArguments:
    base = dict(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    base.update(kw)
    return TrainingArguments(**base)


def _trainer(tmp: Path, callbacks=(), **args_kw) -> Trainer:
    return Trainer(
        model=tiny_gpt2(),
        args=_args(tmp / "unused-output", **args_kw),
        train_dataset=TokenDataset(),
        callbacks=list(callbacks),
    )


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    """The same run, uninterrupted and without kubeckpt."""
    torch.set_num_threads(1)
    trainer = _trainer(Path("/nonexistent"))
    trainer.train()
    return _params(trainer.model)


def _kubeckpt(tmp: Path, **env_extra: str) -> Trainer:
    config = Config.from_env(_env(tmp, **env_extra))
    return kubeckpt_trainer(_trainer(tmp), config)


def test_progress_and_periodic_save_resumable_by_plain_hf(tmp_path, reference):
    trainer = _kubeckpt(tmp_path)
    trainer.train()
    root = tmp_path / "ckpt"
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(4, True), (8, True)]
    _, problems = layout.verify_checkpoint(root / "checkpoint-8", checksums=True)
    assert problems == []
    assert (root / "checkpoint-8" / "trainer_state.json").exists()

    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == STEPS and progress["totalSteps"] == STEPS
    assert progress["percentComplete"] == "100.0"
    for key in ("loss", "learningRate", "lastUpdateTime", "epoch"):
        assert key in progress, key
    assert progress["checkpointing"]["checkpointsCreated"] == 2
    assert progress["checkpointing"]["latestCheckpoint"] == str(root / "checkpoint-8")
    assert (tmp_path / "termination-log").exists()

    # Plain transformers (no kubeckpt code) resumes from our checkpoint and ends as a full run does.
    plain = _trainer(tmp_path)
    plain.train(resume_from_checkpoint=str(root / "checkpoint-8"))
    assert plain.state.global_step == STEPS
    for name, value in _params(plain.model).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)


def test_retention_follows_save_total_limit(tmp_path):
    config = Config.from_env(_env(tmp_path, CHECKPOINT_SAVE_STEPS="2"))
    trainer = kubeckpt_trainer(_trainer(tmp_path, save_total_limit=2), config)
    assert trainer.args.save_total_limit is None  # taken over
    trainer.train()
    assert [e.step for e in layout.scan(tmp_path / "ckpt")] == [8, 10]


def test_incomplete_checkpoint_skipped_and_cleaned(tmp_path):
    root = tmp_path / "ckpt"
    trainer = _kubeckpt(tmp_path)
    trainer.train()
    # A save killed mid-write: a later step with the sentinel still there and no manifest.
    shutil.copytree(root / "checkpoint-8", root / "checkpoint-9")
    (root / "checkpoint-9" / "manifest.json").unlink()
    (root / "checkpoint-9" / INCOMPLETE_SENTINEL).write_text("x")
    # And one whose manifest was written but whose sentinel was not yet removed.
    shutil.copytree(root / "checkpoint-8", root / "checkpoint-10")
    (root / "checkpoint-10" / INCOMPLETE_SENTINEL).write_text("x")
    # A complete-looking one with a truncated file fails verification and is skipped.
    shutil.copytree(root / "checkpoint-8", root / "checkpoint-11")
    with open(root / "checkpoint-11" / "trainer_state.json", "r+b") as f:
        f.truncate(5)

    assert resume_checkpoint(root) == str(root / "checkpoint-8")
    assert not (root / "checkpoint-9").exists() and not (root / "checkpoint-10").exists()
    assert (root / "checkpoint-11").exists()  # left for inspection, never resumed from


def test_resume_checkpoint_refuses_a_store_where_none_verifies(tmp_path, monkeypatch):
    """Issue 27: with every checkpoint truncated, nothing verifies: the helper a script passes
    to train() stops the process (exit 65) naming them, unless the policy allows a fresh start."""
    root = tmp_path / "ckpt"
    _kubeckpt(tmp_path).train()
    saved = sorted(root.glob("checkpoint-*"))
    assert saved
    for path in saved:
        with open(path / "trainer_state.json", "r+b") as f:
            f.truncate(5)
    with pytest.raises(ResumeRefused) as refused:
        resume_checkpoint(root)
    assert refused.value.code == UNVERIFIABLE_EXIT_CODE
    for path in saved:
        assert f"{path}: size mismatch: trainer_state.json" in str(refused.value)
    monkeypatch.setenv("CHECKPOINT_ON_UNVERIFIABLE", "StartFresh")
    assert resume_checkpoint(root) is None
    assert all(p.exists() for p in saved)  # left for inspection


class _SigtermAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_stops_and_resumes_exactly(tmp_path, reference):
    root = tmp_path / "ckpt"
    env = {"CHECKPOINT_STRATEGY": "time", "CHECKPOINT_INTERVAL": "1h"}
    first = _kubeckpt(tmp_path, **env)
    # Ours is added after _SigtermAt's, so the signal lands before our per-step check.
    first.callback_handler.callbacks.insert(0, _SigtermAt(5))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        first.train()
        # Stopped for a JIT checkpoint: a later SIGTERM (the kubelet's after preStop) is only
        # logged, so the exit stays clean.
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, previous)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert first.kubeckpt.stopped
    assert first.state.global_step == 5
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(5, True)]
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 5
    assert progress["checkpointing"]["latestCheckpointReason"] == "jit"

    second = _kubeckpt(tmp_path, **env)
    second.train()
    assert signal.getsignal(signal.SIGTERM) == previous  # not stopped: the handler is given back
    assert second.kubeckpt.resumed_from == str(root / "checkpoint-5")
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["resumedFrom"] == "checkpoint-5"
    # No save in this run: the resumed checkpoint is still the latest one.
    assert progress["checkpointing"]["latestCheckpoint"] == str(root / "checkpoint-5")
    assert progress["checkpointing"]["latestCheckpointReason"] == "resume"
    assert second.state.global_step == STEPS
    for name, value in _params(second.model).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)


def test_prestop_request_is_acknowledged(tmp_path):
    run = tmp_path / "run"
    env = {"CHECKPOINT_STRATEGY": "time", "CHECKPOINT_INTERVAL": "1h"}
    trainer = _kubeckpt(tmp_path, **env)

    class _Request(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                run.mkdir(exist_ok=True)
                (run / "checkpoint-request").write_text("")

    trainer.callback_handler.callbacks.insert(0, _Request())
    trainer.train()
    assert trainer.state.global_step == 3
    assert (run / "checkpoint-done").exists() and not (run / "checkpoint-request").exists()
    assert json.loads((run / "checkpoint-done").read_text())["step"] == 3
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(3, True)]


def test_from_env_reads_the_environment(tmp_path, monkeypatch):
    for key, value in _env(tmp_path).items():
        monkeypatch.setenv(key, value)
    callback = KubeckptCallback.from_env()
    assert callback.root == str(tmp_path / "ckpt")
    trainer = _trainer(tmp_path, callbacks=[callback])
    assert trainer.args.output_dir == str(tmp_path / "ckpt")


def test_trainer_own_save_strategy_is_made_atomic(tmp_path):
    env = {"CHECKPOINT_STRATEGY": "time", "CHECKPOINT_INTERVAL": "1h"}
    config = Config.from_env(_env(tmp_path, **env))
    trainer = kubeckpt_trainer(_trainer(tmp_path, save_strategy="steps", save_steps=3), config)
    trainer.train()
    root = tmp_path / "ckpt"
    # The Trainer saves at 3, 6, 9 and at the last step; CHECKPOINT_MAX_CHECKPOINTS (3) keeps the
    # newest three, and every one has a manifest.
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(6, True), (9, True), (10, True)]


def test_epoch_strategy(tmp_path):
    config = Config.from_env(_env(tmp_path, CHECKPOINT_STRATEGY="epoch"))
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path / "unused-output", max_steps=-1, num_train_epochs=2),
        train_dataset=TokenDataset(16),  # 4 steps per epoch
    )
    kubeckpt_trainer(trainer, config).train()
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(4, True), (8, True)]
    assert json.loads((tmp_path / "progress.json").read_text())["totalEpochs"] == 2


def test_stop_at_an_epochs_last_step_saves_once(tmp_path):
    """on_step_end saves and stops; on_epoch_end follows at the same step and must not save again
    (that would delete the complete checkpoint, or write into it after its manifest)."""
    config = Config.from_env(
        _env(tmp_path, CHECKPOINT_STRATEGY="epoch", CHECKPOINT_MAX_CHECKPOINTS="1")
    )
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path / "unused-output", max_steps=-1, num_train_epochs=2),
        train_dataset=TokenDataset(16),  # 4 steps per epoch
        callbacks=[_SigtermAt(4)],
    )
    trainer = kubeckpt_trainer(trainer, config)
    trainer.train()
    assert trainer.state.global_step == 4 and trainer.kubeckpt.stopped
    root = tmp_path / "ckpt"
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(4, True)]
    _, problems = layout.verify_checkpoint(root / "checkpoint-4", checksums=True)
    assert problems == []
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["checkpointing"]["checkpointsCreated"] == 1


class _Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.1)


def test_time_strategy_saves_by_wall_clock(tmp_path):
    config = Config.from_env(
        _env(tmp_path, CHECKPOINT_STRATEGY="time", CHECKPOINT_INTERVAL="250ms")
    )
    trainer = kubeckpt_trainer(_trainer(tmp_path, callbacks=[_Slow()]), config)
    trainer.train()
    entries = layout.scan(tmp_path / "ckpt")
    assert len(entries) == 3 and all(e.complete for e in entries)  # the newest 3 of 3 or 4
    steps = [e.step for e in entries]
    assert all(steps[i + 1] - steps[i] >= 2 for i in range(len(steps) - 1)), steps


def test_kubeckpt_trainer_is_idempotent(tmp_path):
    """Zero-code mode attaches kubeckpt from Trainer.__init__; a script that also calls
    kubeckpt_trainer must not get a second callback or a train() wrapped twice."""
    config = Config.from_env(_env(tmp_path))
    trainer = kubeckpt_trainer(_trainer(tmp_path), config)
    callback, train = trainer.kubeckpt, trainer.train
    again = kubeckpt_trainer(trainer, Config.from_env(_env(tmp_path, CHECKPOINT_SAVE_STEPS="2")))
    assert again is trainer and again.kubeckpt is callback and again.train is train
    ours = [c for c in trainer.callback_handler.callbacks if isinstance(c, KubeckptCallback)]
    assert ours == [callback]
    trainer.train()
    # The first config (every 4 steps) is the one in force.
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(4, True), (8, True)]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("way", ["async", "sync"])
def test_a_recreated_job_with_resume_false_keeps_the_first_runs_checkpoints(
    tmp_path, reference, way
):
    """The first job wrote checkpoints 4 and 8. Re-created with resume "false" it trains from
    scratch and, stopped by preStop at 5, saves 4 and a just-in-time 5 into generation-1/
    (the Trainer's own synchronous save included), leaving the first run's untouched; re-created
    again with the default it resumes from generation-1/checkpoint-5, exactly."""
    root = tmp_path / "ckpt"
    run = tmp_path / "run"

    def job(**env: str) -> Trainer:
        config = Config.from_env(_env(tmp_path, **env))
        if way == "async":
            return kubeckpt_trainer(_trainer(tmp_path), config)
        return _trainer(tmp_path, callbacks=[KubeckptCallback(config)])  # the Trainer writes

    first = job()
    first.train()
    assert [(e.generation, e.step) for e in layout.scan(root)] == [(0, 4), (0, 8)]
    before = _tree(root)

    class _Request(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                run.mkdir(exist_ok=True)
                (run / "checkpoint-request").write_text("")

    second = job(CHECKPOINT_RESUME="false", CHECKPOINT_MAX_CHECKPOINTS="1")
    second.callback_handler.callbacks.insert(0, _Request())
    second.train()
    assert second.state.global_step == 5 and json.loads((run / "checkpoint-done").read_text())
    gen1 = root / "generation-1"
    assert [(e.generation, e.step, e.complete) for e in layout.scan(root)] == [
        (0, 4, True), (0, 8, True), (1, 5, True)
    ]  # fmt: skip
    assert {k: v for k, v in _tree(root).items() if not k.startswith("generation-")} == before
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["checkpointing"]["latestCheckpoint"] == str(gen1 / "checkpoint-5")
    assert progress["checkpointing"]["latestCheckpointReason"] == "jit"

    third = job()
    if way == "async":
        third.train()  # kubeckpt_trainer resumes by itself
        assert third.kubeckpt.resumed_from == str(gen1 / "checkpoint-5")
    else:
        path = resume_checkpoint(root)  # what a script that calls train() itself passes
        assert path == str(gen1 / "checkpoint-5")
        third.train(resume_from_checkpoint=path)
    assert third.state.global_step == STEPS
    assert [(e.generation, e.step) for e in layout.scan(root)] == [(0, 4), (0, 8), (1, 5), (1, 8)]
    assert {k: v for k, v in _tree(root).items() if not k.startswith("generation-")} == before
    for name, value in _params(third.model).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)
