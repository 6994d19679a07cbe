"""A real HF save killed mid-write (single process, no torchrun): the restart skips and removes it,
resumes from the previous complete checkpoint and ends with an uninterrupted run's parameters."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness import assert_same_files, finish, start, tail

from trainer_runtime import layout
from trainer_runtime.contract import INCOMPLETE_SENTINEL

JOB = Path(__file__).with_name("hf_job.py")
STEPS = 12


def _run(status: Path, env: dict[str, str], log: Path, *extra: str) -> int:
    argv = [sys.executable, str(JOB), f"--status-dir={status}", f"--steps={STEPS}", *extra]
    return finish(start(argv, env, log))


def test_killed_mid_save_is_skipped_and_cleaned(tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    env_off = {"CHECKPOINT_ENABLED": "false", "TRAINING_PROGRESS_FILE": str(ref / "p.json")}
    assert _run(ref, env_off, tmp_path / "ref.log") == 0, tail(tmp_path / "ref.log")

    root = tmp_path / "job"
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(root / "ckpt"),
        "CHECKPOINT_CONTROL_DIR": str(root / "control"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "4",
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
        "PROGRESS_UPDATE_FREQUENCY": "1",
    }
    rc = _run(root / "status", env, tmp_path / "first.log", "--die-in-save=8")
    assert rc == 137, tail(tmp_path / "first.log")
    ckpt8 = root / "ckpt" / "checkpoint-8"
    assert (ckpt8 / INCOMPLETE_SENTINEL).exists() and not (ckpt8 / "manifest.json").exists()
    assert [(e.step, e.complete) for e in layout.scan(root / "ckpt")] == [(4, True), (8, False)]

    assert _run(root / "status", env, tmp_path / "second.log") == 0, tail(tmp_path / "second.log")
    progress = json.loads((root / "progress.json").read_text())
    assert progress["resumedFrom"] == "checkpoint-4" and progress["step"] == STEPS
    # checkpoint-8 was removed on resume and written again, complete, by the resumed run.
    assert [(e.step, e.complete) for e in layout.scan(root / "ckpt")] == [
        (4, True),
        (8, True),
        (12, True),
    ]
    assert_same_files(ref / "final.pt", root / "status" / "final.pt")
