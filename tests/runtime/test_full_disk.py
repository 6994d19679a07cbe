"""Group 3: the persistent volume fills up during a save (a real ENOSPC from a 1.5 MiB tmpfs).
The save fails with a clear error, its partial files are removed, the previous checkpoint stays
intact and loadable, and training goes on to the same final state as without checkpoints."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from harness import assert_same_files, ckpt_env, read_json
from train_job import train

from trainer_runtime import layout
from trainer_runtime.contract import parse_progress

WIDTH = 256  # ~0.87 MB per checkpoint: the first fits in 1.5 MiB, a second beside it does not
STEPS = 24


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "volume"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (
        "this test fills a real filesystem: it needs root (CAP_SYS_ADMIN) to mount a 1.5 MiB "
        f"tmpfs; run the tests as root or in a privileged container ({proc.stderr.strip()})"
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_enospc_during_save(tmp_path: Path, small_volume: Path) -> None:
    torch.set_num_threads(1)
    ref = tmp_path / "reference"
    train(
        steps=STEPS,
        status_dir=ref,
        width=WIDTH,
        environ={"CHECKPOINT_ENABLED": "false", "TRAINING_PROGRESS_FILE": str(ref / "p.json")},
    )
    env = ckpt_env(
        tmp_path,
        CHECKPOINT_URI=str(small_volume),
        CHECKPOINT_LOCAL_DIR="",
        CHECKPOINT_SAVE_STEPS="5",
        CHECKPOINT_JIT="false",
    )
    status = tmp_path / "status"
    info = train(steps=STEPS, status_dir=status, environ=env, width=WIDTH)

    # Training went on to the end, bit for bit what it would have been.
    assert info["step"] == STEPS and not info["stopped"]
    assert_same_files(ref / "final-0.pt", status / "final-0.pt")
    # Every later save failed, with the reason in words, and was never counted.
    assert info["failed_saves"] == STEPS // 5 - 1, info
    assert "No space left on device" in info["last_error"], info["last_error"]
    assert f"[Errno {errno.ENOSPC}]" in info["last_error"]
    progress = parse_progress((tmp_path / "progress.json").read_bytes())
    assert progress.checkpointing is not None
    assert progress.checkpointing.checkpoints_created == 1
    assert progress.checkpointing.latest_checkpoint == str(small_volume / "checkpoint-5")
    assert "No space left" in progress.checkpointing.last_error
    # The first checkpoint is intact; the failed ones left nothing behind.
    assert [(e.step, e.complete) for e in layout.scan(small_volume)] == [(5, True)]
    assert [p.name for p in small_volume.iterdir()] == ["checkpoint-5"]
    _, problems = layout.verify_checkpoint(small_volume / "checkpoint-5", checksums=True)
    assert problems == []

    # And it is a checkpoint a restart resumes from, again reaching the same final state.
    resumed = tmp_path / "resumed"
    info = train(steps=STEPS, status_dir=resumed, environ=env, width=WIDTH)
    assert info["resumed_from"] == "checkpoint-5"
    assert read_json(resumed / "exit-0.json")["step"] == STEPS  # type: ignore[index]
    assert_same_files(ref / "final-0.pt", resumed / "final-0.pt")
