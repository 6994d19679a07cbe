"""A store whose checkpoints all fail verification (issue 27 item 4): the training process stops
with UNVERIFIABLE_EXIT_CODE and a message naming each bad checkpoint, before any step, instead of
training from step 0 unnoticed; with CHECKPOINT_ON_UNVERIFIABLE=StartFresh it starts at step 0
with a warning. The real torch adapter, as a process."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from harness import ckpt_env, finish, single_argv, start, tail, torchrun_argv
from train_job import train

from trainer_runtime import layout
from trainer_runtime.contract.env import UNVERIFIABLE_EXIT_CODE
from trainer_runtime.contract.progress import UNVERIFIABLE_CHECKPOINTS

STEPS = 15  # persistent checkpoints at 7 and 14


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _corrupt_every_checkpoint(tmp_path: Path) -> list[Path]:
    env = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR="")
    train(steps=STEPS, status_dir=tmp_path / "a", environ=env)
    persistent = tmp_path / "persistent"
    found = [layout.checkpoint_path(persistent, e.step) for e in layout.scan(persistent)]
    assert [p.name for p in found] == ["checkpoint-7", "checkpoint-14"]
    for path in found:
        tensors = path / "rank-0.0.tensors"
        data = bytearray(tensors.read_bytes())
        data[len(data) // 2] ^= 0x01  # same size: only the content hash tells
        tensors.write_bytes(bytes(data))
    return found


def test_only_corrupt_checkpoints_stop_the_process_with_its_exit_code(tmp_path: Path) -> None:
    bad = _corrupt_every_checkpoint(tmp_path)
    env = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR="")
    proc = start(single_argv(tmp_path / "b", steps=STEPS), env, tmp_path / "log")
    rc = finish(proc)
    log = tail(tmp_path / "log")
    assert rc == UNVERIFIABLE_EXIT_CODE, log
    assert "none of 2 checkpoints verifies; not starting from step 0" in log
    for path in bad:
        assert f"{path}: checksum mismatch: rank-0.0.tensors" in log
    assert not (tmp_path / "b" / "status-0.json").exists(), "it must stop before training"
    record = json.loads((tmp_path / "termination-log").read_text())
    named = record["checkpointing"][UNVERIFIABLE_CHECKPOINTS]
    assert named["reason"] == "CheckpointsUnverifiable"
    assert "checkpoint-14: checksum mismatch" in named["message"]
    assert all(p.is_dir() for p in bad), "the bad checkpoints stay for inspection"


def test_start_fresh_trains_from_step_0_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _corrupt_every_checkpoint(tmp_path)
    env = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR="", CHECKPOINT_ON_UNVERIFIABLE="StartFresh")
    with caplog.at_level(logging.WARNING, "trainer_runtime"):
        info = train(steps=STEPS, status_dir=tmp_path / "b", environ=env)
    assert (info["resumed_from"], info["step"]) == (None, STEPS)  # from 0 to the end
    # Its checkpoints go beside the bad ones (a new generation), which are kept.
    assert [e.step for e in layout.scan(tmp_path / "persistent" / "generation-1")] == [7, 14]
    assert "none of 2 checkpoints verifies, starting from step 0" in caplog.text


def test_two_ranks_under_torchrun_both_stop_with_the_code(tmp_path: Path) -> None:
    """DCP checkpoints of a 2-rank job, every one with a shard byte flipped: every rank decides
    alike and torchrun reports the distinct exit code, not a crash."""
    env = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR="")
    proc = start(torchrun_argv(tmp_path / "a", steps=STEPS), env, tmp_path / "a.log")
    assert finish(proc) == 0, tail(tmp_path / "a.log")
    persistent = tmp_path / "persistent"
    for entry in layout.scan(persistent):
        shard = max(
            layout.checkpoint_path(persistent, entry.step).glob("__*_*.distcp"),
            key=lambda p: p.stat().st_size,
        )
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    proc = start(torchrun_argv(tmp_path / "b", steps=STEPS), env, tmp_path / "b.log")
    rc = finish(proc)
    log = tail(tmp_path / "b.log", 20000)
    assert rc != 0 and "none of 2 checkpoints verifies" in log, log
    # torchrun exits 1 for a failed worker and names the worker's own code (the first to end;
    # it then stops the other, which may be slower to exit after writing the records).
    assert f"exitcode  : {UNVERIFIABLE_EXIT_CODE}" in log, log
    assert not (tmp_path / "b" / "status-0.json").exists()
    # Rank 0 wrote the records before exiting: the controller can name the bad checkpoints.
    named = json.loads((tmp_path / "termination-log").read_text())["checkpointing"]
    assert named[UNVERIFIABLE_CHECKPOINTS]["reason"] == "CheckpointsUnverifiable"
