"""Helpers for the runtime scenarios: environments, torchrun launches, state comparison."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("train_job.py")
STEPS = 40


def ckpt_env(root: Path, **overrides: str) -> dict[str, str]:
    """The variables the webhook would inject, pointing into `root`."""
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(root / "persistent"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "7",
        "CHECKPOINT_LOCAL_DIR": str(root / "local"),
        "CHECKPOINT_LOCAL_PERIOD": "3",
        "CHECKPOINT_CONTROL_DIR": str(root / "control"),
        "CHECKPOINT_MAX_CHECKPOINTS": "3",
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "PROGRESS_UPDATE_FREQUENCY": "1",
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
        "KUBECKPT_STAGING_DIR": str(root / "staging"),
    }
    env.update(overrides)
    return env


def process_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHECKPOINT_", "KUBECKPT_"))}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def torchrun(script: Path, *args: str, nproc: int = 2) -> list[str]:
    """argv: `script` under torchrun on this host, `nproc` ranks, no restarts."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        # --standalone: torchrun binds its own free port. A port picked here and released
        # can be taken by another process before torchrun binds it (EADDRINUSE, seen under load).
        "--standalone",
        f"--nproc_per_node={nproc}",
        "--max-restarts=0",
        str(script),
        *args,
    ]


def torchrun_argv(
    status_dir: Path,
    *,
    steps: int = STEPS,
    sleep: float = 0.0,
    fsdp: bool = False,
    nproc: int = 2,
    extra: tuple[str, ...] = (),
) -> list[str]:
    return torchrun(
        JOB,
        f"--status-dir={status_dir}",
        f"--steps={steps}",
        f"--sleep={sleep}",
        *(["--fsdp"] if fsdp else []),
        *extra,
        nproc=nproc,
    )


def single_argv(status_dir: Path, *args: str, steps: int = STEPS) -> list[str]:
    """The job as one plain process (no torchrun)."""
    return [sys.executable, str(JOB), f"--status-dir={status_dir}", f"--steps={steps}", *args]


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # closed by finish()
    proc = subprocess.Popen(
        argv, env=process_env(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    proc._kubeckpt_log = (out, log)  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen[bytes], timeout: float = 120) -> int:
    """Wait for the run; on timeout kill its whole session and fail with the log."""
    out, log = proc._kubeckpt_log  # type: ignore[attr-defined]
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out.close()
        raise AssertionError(f"run did not finish in {timeout} s:\n{tail(log)}") from None
    out.close()
    return rc


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (children first found, then theirs)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the run and everything under it. torchrun starts each rank in a session of its
    own, so killing the launcher's process group alone leaves hung ranks behind (orphaned, each
    holding its model in memory until the process group's 30-minute timeout)."""
    if proc.poll() is None:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def tail(log: Path, n: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for_step(
    status: Path, step: int, proc: subprocess.Popen[bytes], timeout: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = read_json(status)
        if data is not None and data["step"] >= step:
            return data
        if proc.poll() is not None:
            raise AssertionError(f"run exited early (rc {proc.returncode}):\n{tail_of(proc)}")
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {timeout} s:\n{tail_of(proc)}")


def tail_of(proc: subprocess.Popen[bytes]) -> str:
    return tail(proc._kubeckpt_log[1])  # type: ignore[attr-defined]


def assert_same(expected: Any, actual: Any, path: str = "") -> None:
    """Bitwise equality of nested state (tensors compared with dtype, shape and every bit)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path}: tensor expected"
        assert expected.dtype == actual.dtype and expected.shape == actual.shape, path
        assert torch.equal(
            expected.view(-1).view(torch.uint8) if expected.numel() else expected,
            actual.view(-1).view(torch.uint8) if actual.numel() else actual,
        ), f"{path}: tensors differ"
    elif isinstance(expected, dict):
        assert expected.keys() == actual.keys(), f"{path}: {expected.keys()} != {actual.keys()}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{path}/{key}")
    elif isinstance(expected, list | tuple):
        assert len(expected) == len(actual), f"{path}: lengths differ"
        for i, (a, b) in enumerate(zip(expected, actual, strict=True)):
            assert_same(a, b, f"{path}/{i}")
    else:
        assert expected == actual, f"{path}: {expected!r} != {actual!r}"


def assert_same_files(expected: Path, actual: Path) -> None:
    assert actual.exists(), f"{actual} missing: the resumed run did not reach the last step"
    assert_same(torch.load(expected, weights_only=True), torch.load(actual, weights_only=True))
