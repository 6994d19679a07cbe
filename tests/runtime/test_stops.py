"""Stops that are never lost (issue 17): a stop that arrives while the job evaluates or warms up
(no step boundary for longer than the grace period) is saved by the stop watcher at the last
completed optimizer step and resumes bitwise equal to a run never stopped; DataLoader worker
processes survive a SIGTERM sent to the whole process group (as torchrun sends it)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from harness import (
    STEPS,
    assert_same_files,
    ckpt_env,
    finish,
    kill_session,
    read_json,
    single_argv,
    start,
    tail_of,
    torchrun_argv,
    wait_for_step,
)

from trainer_runtime.contract import is_complete, read_manifest

EVAL_AT = 10
LONG = 600.0  # an evaluation or warm-up far longer than any grace period


def _env(root: Path) -> dict[str, str]:
    # The takeover after 1 s without a step boundary (by default: a few step times, within a
    # quarter of the grace period); no local tier, so the checkpoint is the persistent one.
    return ckpt_env(
        root,
        CHECKPOINT_LOCAL_DIR="",
        CHECKPOINT_SAVE_STEPS="1000",
        KUBECKPT_STOP_TAKEOVER_SECONDS="1",
        TORCH_ELASTIC_SHUTDOWN_TIMEOUT="60",
    )


def _wait_for(path: Path, proc, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = read_json(path)
        if data is not None:
            return data
        assert proc.poll() is None, f"exited early (rc {proc.returncode}):\n{tail_of(proc)}"
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear in {timeout} s:\n{tail_of(proc)}")


def _stopped_in_eval(root: Path, argv: list[str], ranks: int, signal_rank: int) -> None:
    """Start the job, SIGTERM one rank while every rank evaluates at EVAL_AT, and wait for the
    preStop answer; then kill the job as the kubelet does when the grace period ends."""
    status = root / "status"
    proc = start(argv, _env(root), root / "run.log")
    try:
        for rank in range(ranks):
            _wait_for(status / f"eval-{rank}.json", proc)
        pid = json.loads((status / f"status-{signal_rank}.json").read_text())["pid"]
        os.kill(pid, signal.SIGTERM)
        done = _wait_for(root / "control" / "checkpoint-done", proc)
        assert done["step"] == EVAL_AT, done
        assert proc.poll() is None, "still evaluating: only the watcher could have saved"
    finally:
        kill_session(proc)
    ckpt = root / "persistent" / f"checkpoint-{EVAL_AT}"
    assert is_complete(ckpt), f"no complete checkpoint at {ckpt}"
    assert read_manifest(ckpt).world_size == ranks
    progress = json.loads((root / "progress.json").read_text())
    assert progress["checkpointing"]["latestCheckpoint"] == str(ckpt)  # written at the save
    assert progress["checkpointing"]["latestCheckpointReason"] == "jit"


def test_sigterm_during_an_evaluation_single_process(tmp_path: Path, single_reference) -> None:
    argv = single_argv(tmp_path / "status", f"--eval-at={EVAL_AT}", f"--eval-seconds={LONG}")
    _stopped_in_eval(tmp_path, argv, ranks=1, signal_rank=0)
    resumed = tmp_path / "resumed"
    proc = start(single_argv(resumed), _env(tmp_path), tmp_path / "resumed.log")
    assert finish(proc) == 0, tail_of(proc)
    assert read_json(resumed / "exit-0.json")["resumed_from"] == f"checkpoint-{EVAL_AT}"
    assert_same_files(single_reference / "final-0.pt", resumed / "final-0.pt")


def test_sigterm_to_one_rank_during_an_evaluation(tmp_path: Path, ddp_reference: Path) -> None:
    extra = (f"--eval-at={EVAL_AT}", f"--eval-seconds={LONG}")
    _stopped_in_eval(tmp_path, torchrun_argv(tmp_path / "status", extra=extra), 2, 1)
    resumed = tmp_path / "resumed"
    proc = start(torchrun_argv(resumed), _env(tmp_path), tmp_path / "resumed.log")
    assert finish(proc) == 0, tail_of(proc)
    for rank in range(2):
        info = read_json(resumed / f"exit-{rank}.json")
        assert info["resumed_from"] == f"checkpoint-{EVAL_AT}", info
        assert_same_files(ddp_reference / f"final-{rank}.pt", resumed / f"final-{rank}.pt")


def test_sigterm_during_warm_up_answers_with_the_restored_checkpoint(tmp_path: Path) -> None:
    """Stopped during a long warm-up right after a restore: nothing was trained since the
    restored checkpoint, so that is the answer; no new checkpoint is written."""
    env = {**_env(tmp_path), "CHECKPOINT_SAVE_STEPS": "5"}
    first = start(single_argv(tmp_path / "a", steps=5), env, tmp_path / "a.log")
    assert finish(first) == 0, tail_of(first)
    assert is_complete(tmp_path / "persistent" / "checkpoint-5")
    warm = tmp_path / "c"
    proc = start(single_argv(warm, f"--warmup-seconds={LONG}", steps=20), env, tmp_path / "c.log")
    try:
        _wait_for(warm / "warmup-0.json", proc)
        os.kill(proc.pid, signal.SIGTERM)
        done = _wait_for(tmp_path / "control" / "checkpoint-done", proc)
        assert done["step"] == 5 and done["checkpoint"].endswith("checkpoint-5"), done
    finally:
        kill_session(proc)
    names = sorted(p.name for p in (tmp_path / "persistent").iterdir())
    assert names == ["checkpoint-5"], names


def test_dataloader_workers_survive_sigterm_to_the_process_group(tmp_path: Path) -> None:
    """torchrun signals each rank's process group: the workers get SIGTERM too. They keep
    serving batches until the main process has saved, and the job stops cleanly."""
    status = tmp_path / "status"
    argv = single_argv(status, "--workers=2", "--sleep=0.05", steps=STEPS)
    proc = start(argv, ckpt_env(tmp_path, CHECKPOINT_SAVE_STEPS="1000"), tmp_path / "run.log")
    try:
        wait_for_step(status / "status-0.json", 5, proc)
        os.killpg(proc.pid, signal.SIGTERM)  # the main process and both workers
        rc = finish(proc)
    finally:
        kill_session(proc)
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert "exited unexpectedly" not in log and "killed by signal" not in log, log[-3000:]
    assert rc == 0, log[-3000:]
    info = read_json(status / "exit-0.json")
    assert info is not None and info["stopped"], info
    assert is_complete(tmp_path / "persistent" / f"checkpoint-{info['step']}")
