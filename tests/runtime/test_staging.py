"""Bounded staging (issue 27 item 3): a state larger than the staging budget is staged in chunks.
The checkpoints are the same bytes as unchunked ones and resume bitwise; host memory stays
within the budget; a run killed in the middle of a chunked save keeps its previous checkpoint."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import (
    REPO,
    assert_same_files,
    ckpt_env,
    finish,
    process_env,
    start,
    tail_of,
    torchrun_argv,
)
from train_job import train

from trainer_runtime.contract import MANIFEST_REASON, is_complete, read_manifest
from trainer_runtime.torch.staging import Chunked

WIDTH = 1024  # ~13 MiB of parameters and Adam state: several 1 MiB chunks, tensors split
BUDGET = str(3 * 1024 * 1024)
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _run(root: Path, steps: int, **extra: str) -> dict:
    # The job leaves Python's and numpy's RNG unseeded; their state is in every checkpoint.
    random.seed(5)
    np.random.seed(5)
    env = ckpt_env(root, CHECKPOINT_MAX_CHECKPOINTS="10", **extra)  # keeps 7 and 14
    return train(steps=steps, status_dir=root / "status", environ=env, width=WIDTH)


def _files(checkpoint: Path) -> list[tuple[str, int, object]]:
    return sorted((f.path, f.size, f.checksum) for f in read_manifest(checkpoint).files)


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run staged whole (no budget), start to end: the checkpoints and final state to match."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("whole")
    assert _run(root, 40)["failed_saves"] == 0
    return root


def test_chunked_saves_write_the_same_checkpoints_and_resume_bitwise(
    tmp_path: Path, whole_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="trainer_runtime.torch"):
        part = _run(tmp_path / "chunked", 20, KUBECKPT_STAGING_BUDGET_BYTES=BUDGET)
    assert part["failed_saves"] == 0
    assert any("in chunks" in r.getMessage() for r in caplog.records), "nothing was chunked"
    for step in (7, 14):  # persistent every 7 steps: the same files, byte for byte
        name = f"checkpoint-{step}"
        chunked = _files(tmp_path / "chunked" / "persistent" / name)
        assert chunked == _files(whole_run / "persistent" / name), name
        assert sum(size for _, size, _ in chunked) > 4 * int(BUDGET)

    resumed = _run(tmp_path / "chunked", 40, KUBECKPT_STAGING_BUDGET_BYTES=BUDGET)
    assert (resumed["resumed_from"], resumed["resumed_tier"]) == ("checkpoint-18", "local")
    assert resumed["failed_saves"] == 0
    assert_same_files(
        whole_run / "status" / "final-0.pt", tmp_path / "chunked" / "status" / "final-0.pt"
    )


def test_sigterm_in_the_middle_of_a_chunked_save(
    tmp_path: Path, whole_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM arrives while the writer is between two chunks of the step-7 persistent save: that
    save commits, the just-in-time save follows at the step where the stop lands, and the run
    resumed from it ends bitwise equal to the one never stopped."""
    copy = Chunked._copy
    calls = {"in_persistent": False}

    def copy_then_signal(self: Chunked, local: list, chunk: list) -> None:
        copy(self, local, chunk)
        if self.chunks_copied == 2 and not calls["in_persistent"]:
            if any(p.name == "checkpoint-7" for p in (tmp_path / "persistent").glob("*")):
                calls["in_persistent"] = True
                os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag

    monkeypatch.setattr(Chunked, "_copy", copy_then_signal)
    try:
        first = _run(tmp_path, 40, KUBECKPT_STAGING_BUDGET_BYTES=BUDGET)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert calls["in_persistent"], "the signal was never sent inside the step-7 save"
    assert first["stopped"] and 7 < first["step"] < 40, first
    assert first["failed_saves"] == 0, first
    assert is_complete(tmp_path / "persistent" / "checkpoint-7")  # the save in flight committed
    jit = tmp_path / "persistent" / f"checkpoint-{first['step']}"
    assert is_complete(jit) and read_manifest(jit).extra.get(MANIFEST_REASON) == "jit"
    monkeypatch.setattr(Chunked, "_copy", copy)
    resumed = _run(tmp_path, 40, KUBECKPT_STAGING_BUDGET_BYTES=BUDGET)
    assert resumed["resumed_from"] == f"checkpoint-{first['step']}", resumed
    assert_same_files(whole_run / "status" / "final-0.pt", tmp_path / "status" / "final-0.pt")


def _bench_case(tmp_path: Path, state_mib: int, budget: int) -> dict:
    bench = REPO / "hack" / "bench" / "runtime_staging.py"
    argv = [sys.executable, str(bench), "--child", f"--state-mib={state_mib}",
            f"--budget-bytes={budget}", f"--dir={tmp_path}"]  # fmt: skip
    env = process_env({"MALLOC_MMAP_THRESHOLD_": str(256 * 1024)})
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_peak_host_memory_of_a_chunked_save_stays_within_the_budget(tmp_path: Path) -> None:
    """Two async saves of a 3x-the-budget state in a fresh process: the peak resident set over
    them, less the training step's own temporaries, is within the budget (with a margin for the
    allocator); staged whole, the same state takes its full size (the measurement can fail)."""
    budget = 32 * MiB
    chunked = _bench_case(tmp_path / "chunked", 96, budget)
    whole = _bench_case(tmp_path / "whole", 96, 1 << 50)
    assert chunked["saves_ok"] == whole["saves_ok"] == 2, (chunked, whole)
    staging = chunked["peak_extra_bytes"] - max(0, chunked["step_extra_bytes"])
    assert staging <= budget + 16 * MiB, chunked
    whole_staging = whole["peak_extra_bytes"] - max(0, whole["step_extra_bytes"])
    assert whole_staging >= 0.9 * whole["state_bytes"], whole


def test_sigkill_during_chunked_saves_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """kill_trials (test_kill_during_save.py's driver) with every save chunked: killed before a
    random file-system call of the writer, a checkpoint that reads complete verifies, resume takes
    the newest, and the run ends bitwise equal to one never interrupted."""
    driver = Path(__file__).with_name("kill_trials.py")
    env = process_env({})
    env["PYTHONPATH"] = f"{driver.parent}:{env['PYTHONPATH']}"
    extra = json.dumps({"KUBECKPT_STAGING_BUDGET_BYTES": "0"})  # 1 MiB chunks
    proc = subprocess.run(
        [sys.executable, str(driver), str(tmp_path), "8", "2711", extra, "512"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    assert len(results) == 8
    for r in results:
        where = f"trial {r['trial']} (killed before writer I/O call {r['kill_at']})"
        assert r["killed"], where
        bad = [c for c in r["left"] if c["complete"] and c["problems"]]
        assert not bad, f"{where}: a checkpoint reads complete but is not: {bad}"
        complete = [c["step"] for c in r["left"] if c["complete"]]
        expected = f"checkpoint-{max(complete)}" if complete else None
        assert r["resume_rc"] == 0 and r["resumed_from"] == expected, (where, r)
        assert r["same"], f"{where}: resumed run differs from the uninterrupted one"


def test_chunked_saves_of_a_ddp_job_resume_bitwise(tmp_path: Path, ddp_reference: Path) -> None:
    """Two ranks, every save chunked (budget 0): the local tier's plain files are streamed
    through the chunk buffer, the persistent DCP checkpoint is written from the live tensors while
    training waits; a run resumed from them ends bitwise equal to one never checkpointed."""
    env = ckpt_env(tmp_path, KUBECKPT_STAGING_BUDGET_BYTES="0")
    first = start(torchrun_argv(tmp_path / "a", steps=20), env, tmp_path / "a.log")
    assert finish(first) == 0, tail_of(first)
    assert is_complete(tmp_path / "persistent" / "checkpoint-14")
    assert (
        read_manifest(tmp_path / "persistent" / "checkpoint-14").extra["kubeckpt"]["format"]
        == "dcp"
    )
    second = start(torchrun_argv(tmp_path / "b"), env, tmp_path / "b.log")
    assert finish(second) == 0, tail_of(second)
    for rank in range(2):
        info = json.loads((tmp_path / "b" / f"exit-{rank}.json").read_text())
        assert info["resumed_from"] is not None and info["failed_saves"] == 0, info
        assert_same_files(ddp_reference / f"final-{rank}.pt", tmp_path / "b" / f"final-{rank}.pt")
