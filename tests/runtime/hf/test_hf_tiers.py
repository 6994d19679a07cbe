"""The HF Trainer on the shared save protocol's tiers: s3:// (uploaded from a staging copy,
manifest last) and the local ramdisk tier beside the persistent one; `train()` resumes from the
newest complete checkpoint across both, bit for bit."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import torch
from kubeckpt_env import kubeckpt_env
from test_callback import _args, _params, _trainer
from test_callback import reference as reference  # the module-scoped fixture
from tiny_hf import TokenDataset, tiny_gpt2
from transformers import Trainer, TrainerCallback

from tests.support.s3 import BUCKET
from trainer_runtime import layout
from trainer_runtime.config import Config
from trainer_runtime.contract import Manifest
from trainer_runtime.hf import kubeckpt_trainer


def _objects(fs, prefix: str) -> list[str]:
    fs.invalidate_cache()
    return sorted(k.removeprefix(prefix + "/") for k in fs.find(prefix))


def test_hf_to_s3_and_back(tmp_path: Path, s3, reference) -> None:
    fs, _ = s3
    prefix = f"{BUCKET}/hf/job-1"
    env = kubeckpt_env(
        tmp_path,
        CHECKPOINT_URI=f"s3://{prefix}",
        KUBECKPT_STAGING_DIR=str(tmp_path / "staging"),
    )
    trainer = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(env))
    assert trainer.kubeckpt.async_save
    trainer.train()
    keys = _objects(fs, prefix)
    steps = sorted({k.split("/")[0] for k in keys})
    assert steps == ["checkpoint-4", "checkpoint-8"], keys
    assert "checkpoint-8/model.safetensors" in keys and "checkpoint-8/manifest.json" in keys
    assert not any(k.endswith("checkpoint-is-incomplete.txt") for k in keys), keys
    manifest = Manifest.from_json(fs.cat(f"{prefix}/checkpoint-8/manifest.json"))
    assert manifest.framework == "transformers" and manifest.step == 8
    for entry in manifest.files:
        assert fs.size(f"{prefix}/checkpoint-8/{entry.path}") == entry.size
    assert not (tmp_path / "staging" / "upload" / "checkpoint-8").exists(), "staging kept"
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["checkpointing"]["latestCheckpoint"] == f"s3://{prefix}/checkpoint-8"

    # A fresh process: train() downloads checkpoint-8, resumes and ends as the uninterrupted run.
    resumed = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(env))
    resumed.train()
    assert json.loads((tmp_path / "progress.json").read_text())["resumedFrom"] == "checkpoint-8"
    for name, value in _params(resumed.model).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)
    assert not (tmp_path / "staging" / "restore" / "checkpoint-8").exists(), "download kept"


class _StopAt(TrainerCallback):
    """Ends the run at `step` as a crash would: before kubeckpt's callback (added last) sees it,
    so no save is decided at that step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_hf_local_tier_is_written_and_resumed_first(tmp_path: Path, reference) -> None:
    env = kubeckpt_env(
        tmp_path,
        CHECKPOINT_LOCAL_DIR=str(tmp_path / "ramdisk"),
        CHECKPOINT_LOCAL_PERIOD="3",
    )
    trainer = kubeckpt_trainer(_trainer(tmp_path, callbacks=[_StopAt(10)]), Config.from_env(env))
    try:
        trainer.train()
    except KeyboardInterrupt:
        pass
    trainer.kubeckpt.stop.close()  # the crash left the save at 9 to finish (and the handler)
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(4, True), (8, True)]
    # KUBECKPT_LOCAL_KEEP=1: the ramdisk holds the newest local checkpoint only.
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ramdisk")] == [(9, True)]
    local = Manifest.from_json(
        (tmp_path / "ramdisk" / "checkpoint-9" / "manifest.json").read_text()
    )
    assert local.tier == "local" and "model.safetensors" in {f.path for f in local.files}
    record = trainer.kubeckpt.ckpt.progress.checkpointing.to_dict()
    assert record["latestLocalCheckpoint"] == str(tmp_path / "ramdisk" / "checkpoint-9")
    assert record["localCheckpointsCreated"] >= 2
    assert record["latestCheckpoint"] == str(tmp_path / "ckpt" / "checkpoint-8")

    resumed = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(env))
    resumed.train()
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["resumedFrom"] == "checkpoint-9"  # the ramdisk's, newer than persistent 8
    for name, value in _params(resumed.model).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)


class _SlowEval(torch.utils.data.Dataset):
    """An evaluation set that takes a while: the signal lands while the Trainer evaluates."""

    def __init__(self, started: threading.Event) -> None:
        self.started = started
        self.base = TokenDataset(16)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        self.started.set()
        time.sleep(0.25)
        return self.base[i]


def test_hf_sigterm_during_an_evaluation_is_saved_before_it_ends(tmp_path: Path) -> None:
    """The stop watcher saves the step the evaluation started at while it still runs (4 s of
    evaluation; the takeover after 0.5 s); training stops at the next step boundary."""
    started = threading.Event()
    env = kubeckpt_env(
        tmp_path,
        CHECKPOINT_SAVE_STEPS="1000",
        KUBECKPT_STOP_TAKEOVER_SECONDS="0.5",
    )
    trainer = Trainer(
        model=tiny_gpt2(),
        args=_args(tmp_path / "unused-output", eval_strategy="steps", eval_steps=3),
        train_dataset=TokenDataset(),
        eval_dataset=_SlowEval(started),
    )
    trainer = kubeckpt_trainer(trainer, Config.from_env(env))
    done = tmp_path / "run" / "checkpoint-done"
    seen: dict[str, object] = {}

    def preempt() -> None:
        assert started.wait(60)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["answered_during_eval"] = done.exists() and trainer.state.global_step == 3

    previous = signal.getsignal(signal.SIGTERM)
    watcher = threading.Thread(target=preempt, daemon=True)
    watcher.start()
    try:
        trainer.train()
    finally:
        signal.signal(signal.SIGTERM, previous)
    watcher.join(5)
    assert seen == {"answered_during_eval": True}
    assert json.loads(done.read_text())["step"] == 3
    assert trainer.kubeckpt.stopped and trainer.state.global_step == 4  # the next boundary
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(3, True)]
    # Plain HF resumes from it.
    plain = Trainer(
        model=tiny_gpt2(), args=_args(tmp_path / "unused-output"), train_dataset=TokenDataset()
    )
    plain.train(resume_from_checkpoint=str(tmp_path / "ckpt" / "checkpoint-3"))
    assert plain.state.global_step == 10
