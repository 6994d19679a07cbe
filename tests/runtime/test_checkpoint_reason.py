"""What the progress record says about the latest checkpoint, in-process (one rank, no group):
why it exists (periodic / jit / resume), and that a resumed run names the checkpoint it resumed
from before it saves again, so `kubectl get tp` never shows a blank Last-Checkpoint."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch
from harness import ckpt_env

from trainer_runtime.contract import read_manifest
from trainer_runtime.torch import CheckpointManager


def _manager(root: Path) -> tuple[CheckpointManager, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    env = ckpt_env(root, CHECKPOINT_SAVE_STEPS="3", CHECKPOINT_LOCAL_DIR="")
    return CheckpointManager.from_env(model, opt, total_steps=20, environ=env), model


def _train(mgr: CheckpointManager, model: torch.nn.Module, start: int, until: int) -> int:
    for step in range(start + 1, until + 1):
        loss = model(torch.ones(1, 4)).sum()
        loss.backward()
        mgr.optimizers[0].step()
        mgr.optimizers[0].zero_grad()
        if mgr.step_end(step, loss=loss.detach()):
            return step
    return until


def _checkpointing(root: Path) -> dict:
    return json.loads((root / "progress.json").read_text())["checkpointing"]


def test_reason_periodic_then_jit_then_resume(tmp_path: Path) -> None:
    mgr, model = _manager(tmp_path)
    mgr.restore()
    _train(mgr, model, 0, 4)  # saves at 3
    mgr.wait()
    mgr.step_end(4)  # a progress write after the save landed
    ck = _checkpointing(tmp_path)
    assert ck["latestCheckpointReason"] == "periodic" and ck["latestCheckpoint"].endswith("-3")

    os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
    stopped = _train(mgr, model, 4, 20)
    assert mgr.stopped and stopped == 5
    ck = _checkpointing(tmp_path)
    assert ck["latestCheckpointReason"] == "jit" and ck["latestCheckpoint"].endswith("-5"), ck
    mgr.close()
    # After the JIT stop a second SIGTERM (the kubelet's, after preStop) does not end the
    # process with 143: the exit stays the clean one the training script chooses.
    os.kill(os.getpid(), signal.SIGTERM)

    again, _ = _manager(tmp_path)
    try:
        assert again.restore() == 5
        again.step_end(6)  # the resumed run's first record, before any save of its own
        record = json.loads((tmp_path / "progress.json").read_text())
        ck = record["checkpointing"]
        assert record["resumedFrom"] == "checkpoint-5"
        assert ck["latestCheckpoint"].endswith("checkpoint-5")
        assert ck["latestCheckpointReason"] == "resume"
        manifest = read_manifest(tmp_path / "persistent" / "checkpoint-5")
        assert ck["latestCheckpointTime"] == manifest.time
    finally:
        again.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_last_loss_that_cannot_be_read_still_leaves_the_final_record(tmp_path: Path) -> None:
    """A process ending because a peer died mid-collective: its last loss is a device value
    whose computation failed, and reading it raises. In the loop that reaches the script; at
    exit the final progress record and termination message are written without the loss."""
    mgr, model = _manager(tmp_path)
    mgr.restore()
    _train(mgr, model, 0, 2)
    mgr.wait()

    def unreadable(loss, learning_rate):
        raise RuntimeError("Gloo all-reduce failed: Connection closed by peer")

    mgr._scalars = unreadable  # type: ignore[method-assign]
    try:
        mgr.step_end(3, loss=torch.ones(()))
    except RuntimeError as e:
        assert "Gloo" in str(e)
    else:
        raise AssertionError("the loop's own read must raise")
    mgr._at_exit()
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 3 and "loss" not in progress, progress
    assert json.loads((tmp_path / "termination-log").read_text())["step"] == 3
    mgr.close()
