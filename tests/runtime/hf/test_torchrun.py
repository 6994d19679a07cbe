"""The HF integration under torchrun with 2 ranks: SIGTERM to one rank mid-run makes both save at
the same step and exit 0; the restart resumes at exactly that step and ends with the parameters of
an uninterrupted run.

The same scenario with transformers' own `enable_jit_checkpoint` (trainer_jit_checkpoint.py) and no
kubeckpt: the signalled rank alone starts a checkpoint (its SIGTERM handler arms a timer; the next
callback stops its loop and calls `_save_checkpoint`), whose first collective (`store_flos`) the
other rank, still training, never joins. Both hang until the process group's timeout (30 min by
default) or the kubelet's SIGKILL, leaving `checkpoint-<n>/` holding only the sentinel; HF's own
resume (`resume_from_checkpoint=True`, `get_last_checkpoint`) ignores the sentinel, picks it, and
the restarted job fails.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from harness import (
    assert_same_files,
    finish,
    kill_session,
    start,
    tail,
    torchrun,
    wait_for_step,
)

from trainer_runtime import layout

JOB = Path(__file__).with_name("hf_job.py")
STEPS = 12


def _argv(status: Path, sleep: float, *extra: str, steps: int = STEPS) -> list[str]:
    # (The early flake caught in this test was an abort at exit: see the end of hf_job.py.)
    return torchrun(JOB, f"--status-dir={status}", f"--steps={steps}", f"--sleep={sleep}", *extra)


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
                "CHECKPOINT_STRATEGY": "steps",
                "CHECKPOINT_SAVE_STEPS": "2",  # async periodic saves, finalized across ranks
                "CHECKPOINT_MAX_CHECKPOINTS": "2",
            }
        )
    return env


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

    records = [json.loads((status / f"stopped-{r}.json").read_text()) for r in (0, 1)]
    assert all(r["async"] for r in records), records  # DDP takes the async path
    stopped = [r["step"] for r in records]
    assert stopped[0] == stopped[1] and 3 <= stopped[0] < STEPS, stopped
    step = stopped[0]
    entries = layout.scan(root / "ckpt")
    assert all(e.complete for e in entries) and entries[-1].step == step, entries
    assert len(entries) == 2 and step - entries[0].step in (1, 2), entries  # retention kept 2
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


def test_one_ranks_failed_write_fails_that_save_on_all_and_training_goes_on(tmp_path: Path) -> None:
    """Rank 1's async write of checkpoint-4 fails (ENOSPC): the ranks' flags on the per-step
    agreement say so, rank 0 never finalizes it and removes it; both ranks train to the end."""
    root = tmp_path / "job"
    status = root / "status"
    env = {**_env(root, True), "CHECKPOINT_SAVE_STEPS": "4", "CHECKPOINT_MAX_CHECKPOINTS": "3"}
    proc = start(_argv(status, 0.0, "--enospc-at=4"), env, tmp_path / "run.log")
    assert finish(proc) == 0, tail(tmp_path / "run.log")
    steps = [json.loads((status / f"stopped-{r}.json").read_text())["step"] for r in (0, 1)]
    assert steps == [STEPS, STEPS]
    assert [(e.step, e.complete) for e in layout.scan(root / "ckpt")] == [(8, True), (12, True)]
    checkpointing = json.loads((root / "progress.json").read_text())["checkpointing"]
    assert checkpointing["failedSaves"] == 1 and checkpointing["checkpointsCreated"] == 2
    assert "No space left" in (tmp_path / "run.log").read_text(errors="replace")


def _step(status: Path, rank: int) -> int:
    try:
        return int((status / f"step-{rank}").read_text())
    except (OSError, ValueError):
        return -1


HANG_S = 15  # no step for this long (a step takes 0.3 s and a little compute): stuck


def test_hf_enable_jit_checkpoint_sigterm_one_rank_hangs_and_leaves_an_unresumable_checkpoint(
    tmp_path: Path,
) -> None:
    root = tmp_path / "hf-jit"
    status = root / "status"
    env = _env(root, False)
    log = tmp_path / "hf-jit.log"
    proc = start(_argv(status, 0.3, "--hf-jit", steps=200), env, log)
    try:
        deadline = time.monotonic() + 90
        while min(_step(status, 0), _step(status, 1)) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, tail(log)
            time.sleep(0.05)
        os.kill(int((status / "pid-1").read_text()), signal.SIGTERM)  # rank 1 only
        # HF's handler waits 3 s ("kill_wait") before asking for the checkpoint. Then neither
        # rank exits nor makes progress: rank 1 is inside the JIT save, in a collective that
        # rank 0 (blocked in its next training step's collectives) never joins.
        deadline = time.monotonic() + 120
        last, since = (-1, -1), time.monotonic()
        while time.monotonic() - since < HANG_S:
            assert proc.poll() is None, f"exited rc={proc.returncode}:\n{tail(log)}"
            assert time.monotonic() < deadline, f"never stopped making progress:\n{tail(log)}"
            steps = (_step(status, 0), _step(status, 1))
            if steps != last:
                last, since = steps, time.monotonic()
            time.sleep(0.2)
        assert last[0] < 200 and last[1] < 200, last
        assert not any((status / f"stopped-{r}.json").exists() for r in (0, 1))
        for pid in (status / "pid-0", status / "pid-1"):
            os.kill(int(pid.read_text()), signal.SIGUSR1)  # faulthandler: dump the stacks
        time.sleep(1)
    finally:
        kill_session(proc)  # what the kubelet does when the grace period runs out
    output = status / "hf-output"
    (ckpt,) = [p for p in output.iterdir() if p.name.startswith("checkpoint-")]
    # Seen every time here: rank 1 blocked in store_flos's all_gather inside
    # execute_jit_checkpoint, rank 0 in its next backward's all_reduce (the SIGUSR1 stack dumps
    # are in the log), so the checkpoint holds only the sentinel. Were rank 1's timer to fire
    # between backward and the optimizer step, its gather could pair with rank 0's logging
    # gather and it would get as far as its RNG file: no model either way.
    names = sorted(p.name for p in ckpt.iterdir())
    assert "model.safetensors" not in names and "trainer_state.json" not in names, names

    # The restart, as HF documents it: resume from the latest checkpoint. The sentinel is not
    # looked at; the empty checkpoint is chosen and the job fails instead of resuming.
    restart = start(_argv(status, 0.0, "--resume-latest"), env, tmp_path / "restart.log")
    assert finish(restart) != 0
    restart_log = (tmp_path / "restart.log").read_text(errors="replace")
    assert f"Can't find a valid checkpoint at {ckpt}" in restart_log, tail(tmp_path / "restart.log")
