"""After a just-in-time stop, no code of the script's that assumes training finished runs
(issue 29, item 4).

final_marker_job.py writes a "final" marker (and saves a "final" model) after `trainer.train()`,
and a "finally" marker from a `finally:` around it, and preempts itself with SIGTERM at step 3.
Zero-code mode (the script knows nothing of kubeckpt): the process ends with 143 as soon as the
just-in-time checkpoint is committed and the progress record says so; neither marker is written,
also when the stop's save failed; run again, it resumes and reaches its real end, marker
included. Library mode (the script adopted kubeckpt itself): `train()` returns with a warning;
the documented `if trainer.kubeckpt.stopped: sys.exit(trainer.kubeckpt.exit_code)` leaves no
marker, a script that ignores it writes one on the partial model (and was warned).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO, tail

from trainer_runtime import layout
from trainer_runtime.contract import PREEMPTED_EXIT_CODE
from trainer_runtime.zerocode import pythonpath_entries
from trainer_runtime.zerocode.install import install

JOB = Path(__file__).with_name("final_marker_job.py")
STEPS = 12
PREEMPT_AT = 3
RETURNED = "kubeckpt: train() returns because training was stopped for preemption"
ENDED = f"the process exits with {PREEMPTED_EXIT_CODE} now"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime as zero-code mode's init container installs it."""
    return install(tmp_path_factory.mktemp("zerocode") / "runtime")


def _env(root: Path, pythonpath: list[str], **extra: str) -> dict[str, str]:
    """The test process's environment without kubeckpt's variables, plus the webhook's into
    `root`. Periodic saves never fire: the only checkpoint is the stop's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CHECKPOINT_", "KUBECKPT_", "TRAINING_PROGRESS", "PROGRESS_UPDATE"))
    }
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env["OMP_NUM_THREADS"] = "1"
    env.update(
        CHECKPOINT_ENABLED="true",
        CHECKPOINT_URI=str(root / "ckpt"),
        CHECKPOINT_STRATEGY="time",
        CHECKPOINT_INTERVAL="3600",
        CHECKPOINT_RESUME="true",
        CHECKPOINT_JIT="true",
        CHECKPOINT_CONTROL_DIR=str(root / "control"),
        TRAINING_PROGRESS_FILE=str(root / "progress.json"),
        PROGRESS_UPDATE_FREQUENCY="1",
        KUBECKPT_TERMINATION_LOG=str(root / "termination-log"),
    )
    env.update(extra)
    return env


def _zerocode_env(runtime: Path, root: Path) -> dict[str, str]:
    # The repository is not on the path: the runtime comes from the install, as in the pod.
    return _env(root, pythonpath_entries(str(runtime)))


def _library_env(root: Path) -> dict[str, str]:
    return _env(root, [str(REPO)])


def _run(mode: str, status: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    log = status.parent / f"{status.name}.log"
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, str(JOB), f"--mode={mode}", f"--status-dir={status}", *args],
            env=env,
            cwd=status.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=240,
            check=False,
        )
    return proc.returncode, tail(log, 100_000)


def _ended_at(status: Path) -> int:
    """The step the Trainer ended at, recorded by a callback inside train()."""
    return json.loads((status / "train-end.json").read_text())["step"]


def _end_code_ran(status: Path) -> dict[str, bool]:
    return {name: (status / name).exists() for name in ("final", "final-model", "finally")}


def _progress(root: Path) -> dict:
    return json.loads((root / "progress.json").read_text())


def _assert_jit_checkpoint_committed(root: Path, step: int) -> None:
    assert [(e.step, e.complete) for e in layout.scan(root / "ckpt")] == [(step, True)]
    _, problems = layout.verify_checkpoint(root / "ckpt" / f"checkpoint-{step}", checksums=True)
    assert not problems, problems
    progress = _progress(root)  # what the TrainingProgress is made from, before the exit
    assert progress["step"] == step
    assert progress["checkpointing"]["latestCheckpoint"].endswith(f"checkpoint-{step}")
    assert progress["checkpointing"]["latestCheckpointReason"] == "jit"
    assert (root / "termination-log").read_text()  # the final record's short form


@pytest.mark.timeout(600)
def test_zerocode_preempted_script_never_runs_its_end_code_until_the_real_end(
    runtime: Path, tmp_path: Path
) -> None:
    root = tmp_path / "job"
    env = _zerocode_env(runtime, root)
    status = tmp_path / "first"
    rc, log = _run("zerocode", status, env, f"--steps={STEPS}", f"--sigterm-at={PREEMPT_AT}")
    assert rc == PREEMPTED_EXIT_CODE, log
    assert _end_code_ran(status) == {"final": False, "final-model": False, "finally": False}, log
    step = _ended_at(status)
    assert PREEMPT_AT <= step < STEPS, step
    _assert_jit_checkpoint_committed(root, step)
    assert ENDED in log and RETURNED not in log, log

    # The same script, resumed, to its real end: the end-of-training code runs, once there.
    status = tmp_path / "second"
    rc, log = _run("zerocode", status, env, f"--steps={STEPS}")
    assert rc == 0, log
    assert _end_code_ran(status) == {"final": True, "final-model": True, "finally": True}, log
    assert json.loads((status / "final").read_text())["step"] == STEPS
    assert _progress(root)["resumedFrom"] == f"checkpoint-{step}"
    assert ENDED not in log, log


@pytest.mark.timeout(300)
def test_zerocode_stop_whose_save_failed_still_never_runs_the_end_code(
    runtime: Path, tmp_path: Path
) -> None:
    root = tmp_path / "job"
    status = tmp_path / "run"
    env = _zerocode_env(runtime, root)
    rc, log = _run("zerocode", status, env, f"--sigterm-at={PREEMPT_AT}", "--full-disk")
    assert rc == PREEMPTED_EXIT_CODE, log
    assert _end_code_ran(status) == {"final": False, "final-model": False, "finally": False}, log
    step = _ended_at(status)
    assert PREEMPT_AT <= step < STEPS, step
    assert not [e for e in layout.scan(root / "ckpt") if e.complete]
    checkpointing = _progress(root)["checkpointing"]
    assert checkpointing["failedSaves"] == 1 and checkpointing["lastFailedStep"] == step
    assert "No space left on device" in checkpointing["lastError"]


@pytest.mark.timeout(300)
def test_library_mode_pattern_exits_and_a_script_that_ignores_it_is_warned(
    tmp_path: Path,
) -> None:
    # The documented pattern: train() returns (its `finally:` runs), the check exits 143.
    root = tmp_path / "pattern-job"
    status = tmp_path / "pattern"
    rc, log = _run("pattern", status, _library_env(root), f"--sigterm-at={PREEMPT_AT}")
    assert rc == PREEMPTED_EXIT_CODE, log
    assert _end_code_ran(status) == {"final": False, "final-model": False, "finally": True}, log
    step = _ended_at(status)
    assert PREEMPT_AT <= step < STEPS, step
    _assert_jit_checkpoint_committed(root, step)
    assert log.count(RETURNED) == 1 and ENDED not in log, log

    # A script that ignores it: library mode leaves the process to the script, which goes on
    # to its end-of-training code on the partial model; the warning said so when train()
    # returned, before that code ran.
    root = tmp_path / "ignoring-job"
    status = tmp_path / "ignoring"
    rc, log = _run("library", status, _library_env(root), f"--sigterm-at={PREEMPT_AT}")
    assert rc == 0, log
    assert _end_code_ran(status) == {"final": True, "final-model": True, "finally": True}, log
    step = _ended_at(status)
    assert json.loads((status / "final").read_text())["step"] == step < STEPS
    assert log.count(RETURNED) == 1, log
    assert log.index(RETURNED) < log.index("final marker written"), log
    assert "sys.exit(trainer.kubeckpt.exit_code)" in log, log
