"""Group 5: s3:// checkpoints against a real S3 server (SeaweedFS's S3 gateway, loopback only).
Uploads go from a local staging copy; a checkpoint counts only once its manifest is uploaded
(last) and the sentinel deleted; resume downloads, verifies and loads it, single process and
2-rank DCP alike. A bucket that cannot be written makes saves fail visibly, never count."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import torch
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
from train_job import train

from tests.support.s3 import BUCKET
from trainer_runtime.contract import INCOMPLETE_SENTINEL, MANIFEST_FILE, Manifest


def _objects(fs: object, prefix: str) -> list[str]:
    fs.invalidate_cache()  # type: ignore[attr-defined]
    return sorted(k.removeprefix(prefix + "/") for k in fs.find(prefix))  # type: ignore[attr-defined]


def test_single_process_to_s3_and_back(tmp_path: Path, s3, single_reference: Path) -> None:
    fs, _ = s3
    torch.set_num_threads(1)
    uri = f"s3://{BUCKET}/team-a/job-1"
    env = ckpt_env(
        tmp_path, CHECKPOINT_URI=uri, CHECKPOINT_LOCAL_DIR="", CHECKPOINT_MAX_CHECKPOINTS="2"
    )
    info = train(steps=30, status_dir=tmp_path / "a", environ=env)
    assert info["failed_saves"] == 0, info
    prefix = f"{BUCKET}/team-a/job-1"
    keys = _objects(fs, prefix)
    assert keys == [
        f"checkpoint-{s}/{name}"
        for s in (21, 28)
        for name in ("manifest.json", "rank-0.0.tensors", "rank-0.state.pt")
    ], keys
    manifest = Manifest.from_json(fs.cat(f"{prefix}/checkpoint-28/{MANIFEST_FILE}"))
    assert manifest.step == 28 and manifest.tier == "persistent"
    for entry in manifest.files:
        assert fs.size(f"{prefix}/checkpoint-28/{entry.path}") == entry.size
    assert not (tmp_path / "staging" / "upload" / "checkpoint-28").exists(), "staging kept"

    # An upload that died before its manifest: an incomplete checkpoint, removed at resume.
    fs.pipe(f"{prefix}/checkpoint-29/{INCOMPLETE_SENTINEL}", b"")
    fs.pipe(f"{prefix}/checkpoint-29/rank-0.0.tensors", b"partial")
    info = train(steps=STEPS, status_dir=tmp_path / "b", environ=env)
    assert info["resumed_from"] == "checkpoint-28", info
    assert not any(k.startswith("checkpoint-29/") for k in _objects(fs, prefix))
    assert_same_files(single_reference / "final-0.pt", tmp_path / "b" / "final-0.pt")


def test_resume_false_writes_a_new_generation_in_the_bucket(
    tmp_path: Path, s3, single_reference: Path
) -> None:
    """A job re-created with resume "false" keeps the first run's objects untouched and writes
    generation-1/; the default then resumes from there, exactly."""
    fs, _ = s3
    torch.set_num_threads(1)
    uri = f"s3://{BUCKET}/team-a/job-gen"
    prefix = f"{BUCKET}/team-a/job-gen"
    env = ckpt_env(tmp_path, CHECKPOINT_URI=uri, CHECKPOINT_LOCAL_DIR="")
    train(steps=30, status_dir=tmp_path / "a", environ=env)
    before = {k: fs.cat_file(f"{prefix}/{k}") for k in _objects(fs, prefix)}
    assert sorted({k.split("/")[0] for k in before}) == [
        "checkpoint-14",
        "checkpoint-21",
        "checkpoint-28",
    ]

    info = train(steps=9, status_dir=tmp_path / "b", environ={**env, "CHECKPOINT_RESUME": "false"})
    assert info["resumed_from"] is None and info["failed_saves"] == 0, info
    keys = _objects(fs, prefix)
    assert {k: fs.cat_file(f"{prefix}/{k}") for k in keys if k in before} == before
    assert sorted({k.rsplit("/", 1)[0] for k in keys if k.startswith("generation-")}) == [
        "generation-1/checkpoint-7"
    ]

    info = train(steps=STEPS, status_dir=tmp_path / "c", environ=env)
    assert info["resumed_from"] == "generation-1/checkpoint-7", info
    assert_same_files(single_reference / "final-0.pt", tmp_path / "c" / "final-0.pt")
    keys = _objects(fs, prefix)
    assert {k: fs.cat_file(f"{prefix}/{k}") for k in keys if k in before} == before
    assert sorted({k.rsplit("/", 1)[0] for k in keys if k.startswith("generation-")}) == [
        "generation-1/checkpoint-21",
        "generation-1/checkpoint-28",
        "generation-1/checkpoint-35",
    ]


def test_unwritable_bucket_fails_visibly(tmp_path: Path, s3) -> None:
    torch.set_num_threads(1)
    env = ckpt_env(tmp_path, CHECKPOINT_URI="s3://no-such-bucket/job", CHECKPOINT_LOCAL_DIR="")
    info = train(steps=15, status_dir=tmp_path / "a", environ=env)
    assert info["step"] == 15 and info["failed_saves"] == 2, info  # steps 7 and 14
    assert "persistent tier" in info["last_error"] and "bucket" in info["last_error"].lower()
    progress = read_json(tmp_path / "progress.json")
    assert progress and progress["checkpointing"]["checkpointsCreated"] == 0, progress


def test_two_ranks_jit_to_s3_and_resume(tmp_path: Path, s3, ddp_reference: Path) -> None:
    fs, aws = s3
    uri = f"s3://{BUCKET}/job-ddp"
    env = {**ckpt_env(tmp_path, CHECKPOINT_URI=uri), **aws}
    target = random.Random(5).randint(8, 30)
    proc = start(torchrun_argv(tmp_path / "status", sleep=0.06), env, tmp_path / "run.log")
    try:
        info = wait_for_step(tmp_path / "status" / "status-1.json", target, proc)
        os.kill(info["pid"], signal.SIGTERM)
        assert finish(proc) == 0, tail_of(proc)
    finally:
        kill_session(proc)
    exits = [read_json(tmp_path / "status" / f"exit-{r}.json") for r in range(2)]
    step = exits[0]["step"]  # type: ignore[index]
    assert all(e and e["stopped"] and e["step"] == step for e in exits), exits
    keys = _objects(fs, f"{BUCKET}/job-ddp")
    mine = [k.split("/", 1)[1] for k in keys if k.startswith(f"checkpoint-{step}/")]
    assert MANIFEST_FILE in mine and INCOMPLETE_SENTINEL not in mine, keys
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "rank-1.state.pt"} <= set(mine), mine

    status = tmp_path / "status-resumed"
    proc = start(torchrun_argv(status), env, tmp_path / "resumed.log")
    assert finish(proc) == 0, tail_of(proc)
    for rank in range(2):
        info = read_json(status / f"exit-{rank}.json")
        assert info and info["resumed_from"] == f"checkpoint-{step}", info
        assert_same_files(ddp_reference / f"final-{rank}.pt", status / f"final-{rank}.pt")
