"""FSDP2 (fully_shard, DTensor parameters and optimizer state) on 2 ranks: each rank writes its own
shards through DCP, the local tier holds each rank's shards, and a job stopped just in time and
resumed ends bitwise equal to one never stopped, per-rank BatchNorm statistics included."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from harness import (
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

from trainer_runtime import layout
from trainer_runtime.contract import read_manifest


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp-reference")
    env = {"CHECKPOINT_ENABLED": "false", "TRAINING_PROGRESS_FILE": str(root / "progress.json")}
    proc = start(torchrun_argv(root / "status", fsdp=True), env, root / "log")
    assert finish(proc) == 0, tail_of(proc)
    return root / "status"


def test_fsdp_jit_and_resume_exact(tmp_path: Path, fsdp_reference: Path) -> None:
    env = ckpt_env(tmp_path)
    proc = start(torchrun_argv(tmp_path / "status", sleep=0.06, fsdp=True), env, tmp_path / "a.log")
    try:
        info = wait_for_step(tmp_path / "status" / "status-1.json", 17, proc)
        os.kill(info["pid"], signal.SIGTERM)
        assert finish(proc) == 0, tail_of(proc)
    finally:
        kill_session(proc)
    exits = [read_json(tmp_path / "status" / f"exit-{r}.json") for r in range(2)]
    step = exits[0]["step"]  # type: ignore[index]
    assert all(e and e["stopped"] and e["step"] == step for e in exits), exits
    manifest = read_manifest(tmp_path / "persistent" / f"checkpoint-{step}")
    assert manifest.extra["kubeckpt"]["format"] == "dcp"
    # Both ranks wrote shard data (FSDP: nothing is replicated, so neither is empty).
    sizes = {f.path: f.size for f in manifest.files}
    assert sizes["__0_0.distcp"] > 10_000 and sizes["__1_0.distcp"] > 10_000, sizes
    (newest_local,) = [e.step for e in layout.scan(tmp_path / "local") if e.complete]
    local = read_manifest(tmp_path / "local" / f"checkpoint-{newest_local}")
    assert {f.path for f in local.files} >= {"rank-0.state.pt", "rank-1.state.pt"}

    status = tmp_path / "status-resumed"
    proc = start(torchrun_argv(status, fsdp=True), env, tmp_path / "b.log")
    assert finish(proc) == 0, tail_of(proc)
    for rank in range(2):
        info = read_json(status / f"exit-{rank}.json")
        assert info and info["resumed_from"] == f"checkpoint-{step}", info
        assert_same_files(fsdp_reference / f"final-{rank}.pt", status / f"final-{rank}.pt")
