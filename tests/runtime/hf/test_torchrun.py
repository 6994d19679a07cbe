"""The HF integration under torchrun with 2 ranks: SIGTERM to one rank mid-run makes both save at
the same step and exit 0; the restart resumes at exactly that step and ends with the parameters of
an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from harness import assert_same_files, finish, free_port, start, tail, wait_for_step

from trainer_runtime import layout

JOB = Path(__file__).with_name("hf_job.py")
STEPS = 12


def _argv(status: Path, sleep: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--max-restarts=0",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(JOB),
        f"--status-dir={status}",
        f"--steps={STEPS}",
        f"--sleep={sleep}",
    ]


def _env(root: Path, enabled: bool) -> dict[str, str]:
    env = {
        "CHECKPOINT_ENABLED": "true" if enabled else "false",
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
        "PROGRESS_UPDATE_FREQUENCY": "1",
    }
    if enabled:
        env.update(
            {
                "CHECKPOINT_URI": str(root / "ckpt"),
                "CHECKPOINT_CONTROL_DIR": str(root / "control"),
                "CHECKPOINT_STRATEGY": "time",
                "CHECKPOINT_INTERVAL": "1h",
            }
        )
    return env


# Known flake, under investigation: about 1 run in 11 failed early (~7 s, before training) and
# could not be reproduced to read its log; one rerun keeps CI honest about real regressions
# (a rerun that fails again fails the suite). See the issue 6 note.
@pytest.mark.flaky(reruns=1)
def test_sigterm_one_rank_both_save_same_step_and_resume_exactly(tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    proc = start(_argv(ref / "status", 0.0), _env(ref, False), tmp_path / "ref.log")
    assert finish(proc) == 0, tail(tmp_path / "ref.log")

    root = tmp_path / "job"
    status = root / "status"
    first = start(_argv(status, 0.3), _env(root, True), tmp_path / "first.log")
    wait_for_step(root / "progress.json", 3, first)
    os.kill(int((status / "pid-1").read_text()), signal.SIGTERM)  # rank 1 only
    assert finish(first) == 0, tail(tmp_path / "first.log")

    stopped = [json.loads((status / f"stopped-{r}.json").read_text())["step"] for r in (0, 1)]
    assert stopped[0] == stopped[1] and 3 <= stopped[0] < STEPS, stopped
    step = stopped[0]
    assert [(e.step, e.complete) for e in layout.scan(root / "ckpt")] == [(step, True)]
    ckpt = root / "ckpt" / f"checkpoint-{step}"
    assert (ckpt / "rng_state_0.pth").exists() and (ckpt / "rng_state_1.pth").exists()
    assert json.loads((root / "progress.json").read_text())["step"] == step
    (status / "final.pt").unlink()  # the stopped run's; the resumed run writes the one compared

    second = start(_argv(status, 0.0), _env(root, True), tmp_path / "second.log")
    assert finish(second) == 0, tail(tmp_path / "second.log")
    progress = json.loads((root / "progress.json").read_text())
    assert progress["resumedFrom"] == f"checkpoint-{step}"
    assert progress["step"] == STEPS
    assert_same_files(ref / "status" / "final.pt", status / "final.pt")
