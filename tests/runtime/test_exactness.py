"""Group 1: a 2-rank DDP job stopped just in time and resumed ends bitwise equal to one never
stopped, whatever asked it to stop: SIGTERM through torchrun (a kubelet signalling PID 1 =
torchrun), SIGTERM to one rank only, the preStop request file, and a `bash -c` PID 1 in its own
PID namespace that swallows SIGTERM, where only the preStop request saves the work."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import (
    STEPS,
    assert_same_files,
    ckpt_env,
    finish,
    kill_session,
    read_json,
    start,
    tail_of,
    torchrun_argv,
    wait_for_step,
)

from trainer_runtime.contract import is_complete, parse_progress, read_manifest

SLEEP = 0.06  # per step, so the harness can act at a chosen step
RNG = random.Random(20240515)  # fixed: each scenario still stops at a different step


def _exits(status: Path) -> list[dict]:
    exits = [read_json(status / f"exit-{r}.json") for r in range(2)]
    assert all(exits), f"a rank did not exit cleanly: {exits}"
    assert all(e["groups_left_by_close"] == 0 for e in exits), exits
    return exits  # type: ignore[return-value]


def _check_stopped(root: Path, status: Path, at_least: int) -> int:
    """Both ranks stopped at the same step >= at_least, with a complete checkpoint there."""
    exits = _exits(status)
    steps = {e["step"] for e in exits}
    assert len(steps) == 1, f"ranks stopped at different steps: {exits}"
    step = steps.pop()
    assert all(e["stopped"] for e in exits), exits
    assert at_least <= step < STEPS, (step, at_least)
    ckpt = root / "persistent" / f"checkpoint-{step}"
    assert is_complete(ckpt), f"no complete just-in-time checkpoint at {ckpt}"
    manifest = read_manifest(ckpt)
    assert manifest.step == step and manifest.world_size == 2
    assert manifest.extra["kubeckpt"]["format"] == "dcp"
    return step


def _resume_and_compare(root: Path, env: dict[str, str], ref: Path, stopped_at: int) -> None:
    status = root / "status-resumed"
    proc = start(torchrun_argv(status), env, root / "resumed.log")
    assert finish(proc) == 0, tail_of(proc)
    for rank, info in enumerate(_exits(status)):
        assert info["resumed_from"] == f"checkpoint-{stopped_at}", (rank, info)
        assert info["failed_saves"] == 0, info
        assert_same_files(ref / f"final-{rank}.pt", status / f"final-{rank}.pt")


def test_sigterm_through_torchrun(tmp_path: Path, ddp_reference: Path) -> None:
    env = ckpt_env(tmp_path)
    target = RNG.randint(4, 30)
    proc = start(torchrun_argv(tmp_path / "status", sleep=SLEEP), env, tmp_path / "run.log")
    try:
        wait_for_step(tmp_path / "status" / "status-0.json", target, proc)
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
        finish(proc)
    finally:
        kill_session(proc)
    step = _check_stopped(tmp_path, tmp_path / "status", target)
    progress = parse_progress((tmp_path / "progress.json").read_bytes())
    assert progress.step == step
    assert progress.checkpointing and progress.checkpointing.latest_checkpoint
    assert progress.checkpointing.latest_checkpoint.endswith(f"checkpoint-{step}")
    final = parse_progress((tmp_path / "termination-log").read_bytes())
    assert final.step == step
    _resume_and_compare(tmp_path, env, ddp_reference, step)


def test_sigterm_to_one_rank_only(tmp_path: Path, ddp_reference: Path) -> None:
    env = ckpt_env(tmp_path)
    target = RNG.randint(4, 30)
    proc = start(torchrun_argv(tmp_path / "status", sleep=SLEEP), env, tmp_path / "run.log")
    try:
        info = wait_for_step(tmp_path / "status" / "status-1.json", target, proc)
        os.kill(info["pid"], signal.SIGTERM)  # rank 1 alone; rank 0 learns it through agreement
        assert finish(proc) == 0, tail_of(proc)  # every rank exits 0, so torchrun does too
    finally:
        kill_session(proc)
    step = _check_stopped(tmp_path, tmp_path / "status", target)
    _resume_and_compare(tmp_path, env, ddp_reference, step)


def _prestop(control: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer_runtime.prestop", f"--control-dir={control}",
         f"--timeout={timeout}"],
        capture_output=True, text=True, timeout=timeout + 30, check=False,
    )  # fmt: skip


def test_prestop_request(tmp_path: Path, ddp_reference: Path) -> None:
    env = ckpt_env(tmp_path)
    target = RNG.randint(4, 30)
    proc = start(torchrun_argv(tmp_path / "status", sleep=SLEEP), env, tmp_path / "run.log")
    try:
        wait_for_step(tmp_path / "status" / "status-0.json", target, proc)
        hook = _prestop(tmp_path / "control")
        assert hook.returncode == 0, hook.stdout + hook.stderr  # acknowledged: saved
        assert finish(proc) == 0, tail_of(proc)
    finally:
        kill_session(proc)
    step = _check_stopped(tmp_path, tmp_path / "status", target)
    done = json.loads((tmp_path / "control" / "checkpoint-done").read_text())
    assert done["step"] == step and done["checkpoint"].endswith(f"checkpoint-{step}")
    _resume_and_compare(tmp_path, env, ddp_reference, step)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def test_bash_pid1_that_does_not_forward_signals(tmp_path: Path, ddp_reference: Path) -> None:
    """What a kubelet does: preStop, then SIGTERM to the container's PID 1 only. Here PID 1 is
    `bash -c` in a PID namespace of its own, which (as any PID 1 without a handler) drops it."""
    unshare = shutil.which("unshare")
    assert unshare, "needs util-linux's unshare: apt-get install util-linux"
    probe = subprocess.run([unshare, "--pid", "--fork", "true"], capture_output=True, check=False)
    assert probe.returncode == 0, (
        "needs root (CAP_SYS_ADMIN) to create a PID namespace with unshare --pid: "
        f"{probe.stderr.decode(errors='replace')}"
    )
    env = ckpt_env(tmp_path)
    inner = " ".join(f"'{a}'" for a in torchrun_argv(tmp_path / "status", sleep=SLEEP))
    # `; echo` keeps bash from exec'ing torchrun, so bash really stays PID 1.
    argv = [unshare, "--pid", "--fork", "--kill-child", "bash", "-c", f"{inner}; echo exited $?"]
    proc = start(argv, env, tmp_path / "run.log")
    try:
        target = RNG.randint(4, 24)
        status0 = tmp_path / "status" / "status-0.json"
        wait_for_step(status0, target, proc)
        (pid1,) = _children(proc.pid)  # bash, PID 1 inside the namespace
        os.kill(pid1, signal.SIGTERM)  # the kubelet's SIGTERM: dropped, nobody else sees it
        before = read_json(status0)["step"]  # type: ignore[index]
        time.sleep(0.6)
        after = read_json(status0)["step"]  # type: ignore[index]
        assert after > before, "training should go on: the signal never reached the ranks"
        assert not (tmp_path / "status" / "exit-0.json").exists()
        hook = _prestop(tmp_path / "control")  # the rescue
        assert hook.returncode == 0, hook.stdout + hook.stderr
        assert finish(proc) == 0, tail_of(proc)
    finally:
        kill_session(proc)
    assert "exited 0" in (tmp_path / "run.log").read_text()
    step = _check_stopped(tmp_path, tmp_path / "status", target)
    _resume_and_compare(tmp_path, env, ddp_reference, step)


@pytest.mark.parametrize("trigger", ["signal", "request"])
def test_single_process_jit_exact(tmp_path: Path, single_reference: Path, trigger: str) -> None:
    """The same for a single process (plain format, no process group)."""
    env = ckpt_env(tmp_path)
    job = str(Path(__file__).with_name("train_job.py"))
    status = tmp_path / "status"
    argv = [sys.executable, job, f"--status-dir={status}", f"--steps={STEPS}", f"--sleep={SLEEP}"]
    target = RNG.randint(4, 30)
    proc = start(argv, env, tmp_path / "run.log")
    try:
        wait_for_step(status / "status-0.json", target, proc)
        if trigger == "signal":
            proc.send_signal(signal.SIGTERM)
        else:
            assert _prestop(tmp_path / "control").returncode == 0
        assert finish(proc) == 0, tail_of(proc)
    finally:
        kill_session(proc)
    info = read_json(status / "exit-0.json")
    assert info and info["stopped"], info
    step = info["step"]
    manifest = read_manifest(tmp_path / "persistent" / f"checkpoint-{step}")
    assert manifest.extra["kubeckpt"]["format"] == "plain"
    proc = start([*argv[:-1], "--sleep=0"], env, tmp_path / "resumed.log")
    assert finish(proc) == 0, tail_of(proc)
    resumed = read_json(status / "exit-0.json")
    assert resumed and resumed["resumed_from"] == f"checkpoint-{step}", resumed
    assert_same_files(single_reference / "final-0.pt", status / "final-0.pt")
