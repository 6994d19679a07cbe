"""Group 2 driver: SIGKILL at random moments of checkpoint I/O, then resume; prints JSON results.

Run by test_kill_during_save.py in a fresh interpreter that imports and warms up torch once and
forks one child per run (far cheaper than a new interpreter each time). A moment is "just before the
k-th file-system call of the writer thread" (open, write, fsync, rename, unlink, mkdir, rmdir):
every boundary of the save protocol, picked at random with a fixed seed; the child SIGKILLs
itself there.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import traceback
from pathlib import Path

import torch
from harness import ckpt_env
from train_job import train

from trainer_runtime import layout

STEPS = 12
IO_CALLS = ("open", "write", "fsync", "replace", "rename", "unlink", "mkdir", "rmdir")


def instrument(kill_at: int | None, counter_file: Path | None) -> None:
    """Count writer-thread file-system calls; SIGKILL this process just before call `kill_at`."""
    lock = threading.Lock()
    count = [0]

    def wrap(name: str):
        original = getattr(os, name)

        def call(*args, **kwargs):
            if threading.current_thread().name.startswith("kubeckpt-persist"):
                with lock:
                    count[0] += 1
                    n = count[0]
                if counter_file is not None:
                    counter_file.write_text(str(n))
                if kill_at is not None and n == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)

        return call

    for name in IO_CALLS:
        setattr(os, name, wrap(name))


def run_child(fn) -> int:
    """Fork; run fn() in the child; the child's wait status."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            torch.set_num_threads(1)
            fn()
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


EXTRA_ENV: dict[str, str] = {}  # argv[4] (JSON): more variables, e.g. a staging budget
WIDTH = 64  # argv[5]: the model's width (a larger state is staged in more chunks)


def env_for(root: Path) -> dict[str, str]:
    return ckpt_env(root, CHECKPOINT_SAVE_STEPS="3", CHECKPOINT_LOCAL_PERIOD="2", **EXTRA_ENV)


def tiers_state(root: Path) -> list[dict]:
    """Every checkpoint left on disk: complete or not, and whether a complete one verifies."""
    found = []
    for tier in ("local", "persistent"):
        for entry in layout.scan(root / tier):
            path = root / tier / f"checkpoint-{entry.step}"
            problems: list[str] = []
            if entry.complete:
                _, problems = layout.verify_checkpoint(path, checksums=True)
            found.append(
                {"tier": tier, "step": entry.step, "complete": entry.complete, "problems": problems}
            )
    return found


def main() -> int:
    root = Path(sys.argv[1])
    trials = int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]))
    global WIDTH
    if len(sys.argv) > 4:
        EXTRA_ENV.update(json.loads(sys.argv[4]))
    if len(sys.argv) > 5:
        WIDTH = int(sys.argv[5])
    sys.stdout.reconfigure(line_buffering=True)

    ref = root / "reference"
    off = {"CHECKPOINT_ENABLED": "false", "TRAINING_PROGRESS_FILE": str(ref / "progress.json"),
           "KUBECKPT_TERMINATION_LOG": str(ref / "termination-log")}  # fmt: skip
    # In this process, with one intra-op thread (no OpenMP team to break the forks): it also
    # warms up torch's lazy imports and caches, which every child then inherits.
    torch.set_num_threads(1)
    train(steps=STEPS, status_dir=ref, environ=off, width=WIDTH)

    calib = root / "calibration"
    counter = calib / "io-calls"
    calib.mkdir(parents=True)

    def calibrate() -> None:
        instrument(None, counter)
        train(steps=STEPS, status_dir=calib / "status", environ=env_for(calib), width=WIDTH)

    assert run_child(calibrate) == 0
    total = int(counter.read_text())

    results = []
    moments = rng.sample(range(1, total + 1), min(trials, total))
    for i, kill_at in enumerate(moments):
        trial = root / f"trial-{i}"
        trial.mkdir()
        env = env_for(trial)

        def doomed(env=env, trial=trial, kill_at=kill_at) -> None:
            instrument(kill_at, None)
            train(steps=STEPS, status_dir=trial / "status", environ=env, width=WIDTH)

        status = run_child(doomed)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        left = tiers_state(trial)
        status_b = run_child(lambda env=env, trial=trial: train(
            steps=STEPS, status_dir=trial / "status", environ=env, width=WIDTH))  # fmt: skip
        exit_info = json.loads((trial / "status" / "exit-0.json").read_text())
        final = trial / "status" / "final-0.pt"
        same = False
        if final.exists():
            a = torch.load(ref / "final-0.pt", weights_only=True)
            b = torch.load(final, weights_only=True)
            same = (
                all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
                and all(
                    torch.equal(x, y)
                    for k in a["optim"]["state"]
                    for x, y in zip(
                        a["optim"]["state"][k].values(),
                        b["optim"]["state"][k].values(),
                        strict=True,
                    )
                )
                and torch.equal(a["rng"], b["rng"])
            )
        results.append(
            {
                "trial": i,
                "kill_at": kill_at,
                "killed": killed,
                "left": left,
                "resume_rc": status_b,
                "resumed_from": exit_info["resumed_from"],
                "same": same,
            }
        )
    print(json.dumps({"io_calls_per_run": total, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
