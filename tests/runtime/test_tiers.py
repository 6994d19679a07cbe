"""Group 4: retention and tier selection. The newest complete checkpoint wins across the local and
persistent tiers (local on a tie, being faster); a corrupt or truncated copy is skipped for the next
one; incomplete ones are removed; retention keeps maxCheckpoints and never the newest complete."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from harness import STEPS, assert_same_files, ckpt_env, finish, start, tail_of, torchrun_argv
from train_job import train

from trainer_runtime import layout
from trainer_runtime.contract import INCOMPLETE_SENTINEL, Manifest, build_manifest, read_manifest
from trainer_runtime.fsutil import remove_tree


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _steps(tier: Path) -> list[tuple[int, bool]]:
    return [(e.step, e.complete) for e in layout.scan(tier)]


def _flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_retention_and_newest_wins(tmp_path: Path, single_reference: Path) -> None:
    env = ckpt_env(tmp_path, CHECKPOINT_MAX_CHECKPOINTS="2")
    train(steps=STEPS, status_dir=tmp_path / "a", environ=env)
    # Persistent every 7 steps, 2 kept; local every 3 steps, 1 kept (the ramdisk holds one).
    assert _steps(tmp_path / "persistent") == [(28, True), (35, True)]
    assert _steps(tmp_path / "local") == [(39, True)]
    manifest = read_manifest(tmp_path / "local" / "checkpoint-39")
    assert manifest.tier == "local" and manifest.step == 39

    # A restart takes local 39 (newer than persistent 35) and ends where the reference ended.
    info = train(steps=STEPS, status_dir=tmp_path / "b", environ=env)
    assert (info["resumed_from"], info["resumed_tier"]) == ("checkpoint-39", "local")
    assert_same_files(single_reference / "final-0.pt", tmp_path / "b" / "final-0.pt")


def test_corrupt_local_copy_falls_back_to_persistent(tmp_path: Path, single_reference: Path):
    env = ckpt_env(tmp_path)
    train(steps=STEPS, status_dir=tmp_path / "a", environ=env)
    _flip_byte(tmp_path / "local" / "checkpoint-39" / "rank-0.0.tensors")  # same size, other bits
    info = train(steps=STEPS, status_dir=tmp_path / "b", environ=env)
    assert (info["resumed_from"], info["resumed_tier"]) == ("checkpoint-35", "persistent")
    assert_same_files(single_reference / "final-0.pt", tmp_path / "b" / "final-0.pt")


def test_same_step_in_both_tiers_prefers_local_unless_corrupt(tmp_path: Path) -> None:
    # Steps 6 and 3: both tiers hold step 36 at the end of a 36-step run.
    env = ckpt_env(tmp_path, CHECKPOINT_SAVE_STEPS="6")
    train(steps=36, status_dir=tmp_path / "a", environ=env)
    assert (36, True) in _steps(tmp_path / "local")
    assert (36, True) in _steps(tmp_path / "persistent")
    info = train(steps=38, status_dir=tmp_path / "b", environ=env)
    assert (info["resumed_from"], info["resumed_tier"]) == ("checkpoint-36", "local")

    # Rewind both tiers to 36 again, then corrupt the local copy's state file.
    for tier in ("local", "persistent"):
        for e in layout.scan(tmp_path / tier):
            if e.step > 36:
                remove_tree(tmp_path / tier / f"checkpoint-{e.step}")
    _flip_byte(tmp_path / "local" / "checkpoint-36" / "rank-0.state.pt", offset=60)
    info = train(steps=38, status_dir=tmp_path / "c", environ=env)
    assert (info["resumed_from"], info["resumed_tier"]) == ("checkpoint-36", "persistent")
    assert_same_files(tmp_path / "b" / "final-0.pt", tmp_path / "c" / "final-0.pt")


def test_truncated_and_incomplete_are_skipped(tmp_path: Path, single_reference: Path) -> None:
    # Sizes are always checked, even with checksums off.
    env = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR="", KUBECKPT_VERIFY_CHECKSUMS="never")
    train(steps=STEPS, status_dir=tmp_path / "a", environ=env)
    persistent = tmp_path / "persistent"
    assert _steps(persistent) == [(21, True), (28, True), (35, True)]
    tensors = persistent / "checkpoint-35" / "rank-0.0.tensors"
    tensors.write_bytes(tensors.read_bytes()[:-8])
    # A newer checkpoint that never finished: sentinel still there, manifest and all.
    newer = persistent / "checkpoint-38"
    newer.mkdir()
    (newer / INCOMPLETE_SENTINEL).write_text("")
    (newer / "manifest.json").write_text("{}")
    info = train(steps=STEPS, status_dir=tmp_path / "b", environ=env)
    assert info["resumed_from"] == "checkpoint-28"
    assert not newer.exists(), "incomplete checkpoints are removed at resume"
    assert_same_files(single_reference / "final-0.pt", tmp_path / "b" / "final-0.pt")


def test_retention_never_deletes_newest_complete(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    for step in (1, 2, 3):
        path = layout.begin(root, step)
        (path / "data").write_bytes(b"x" * step)
        layout.finalize(path, _manifest(path, step))
    layout.begin(root, 4)  # in progress: not counted, not deleted
    assert layout.retain(root, keep=1) == [1, 2]
    assert _steps(root) == [(3, True), (4, False)]
    assert layout.retain(root, keep=0) == []  # 0 is read as 1: the newest complete stays


def _manifest(path: Path, step: int) -> Manifest:
    return build_manifest(
        path, step=step, epoch=0, world_size=1, framework="test", tier="persistent"
    )


def _flip_middle_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x10]))


def test_flipped_byte_in_a_plain_shard_is_caught_at_any_size(
    tmp_path: Path,
    single_reference: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The default ("auto") checks content whatever the checkpoint's size: a byte flipped in the
    middle of a tensor shard (same size) makes restore skip that checkpoint."""
    env = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR="")
    train(steps=STEPS, status_dir=tmp_path / "a", environ=env)
    newest = tmp_path / "persistent" / "checkpoint-35"
    shard = max(newest.glob("rank-0.*.tensors"), key=lambda p: p.stat().st_size)
    _flip_middle_byte(shard)
    # Every checkpoint now reads as a terabyte: a size threshold would skip the content check.
    monkeypatch.setattr(Manifest, "total_size", property(lambda self: 10**12))
    with caplog.at_level(logging.WARNING):
        info = train(steps=STEPS, status_dir=tmp_path / "b", environ=env)
    assert info["resumed_from"] == "checkpoint-28"
    skipped = [r.getMessage() for r in caplog.records if "checkpoint-35" in r.getMessage()]
    assert any(f"checksum mismatch: {shard.name}" in m for m in skipped), skipped
    assert_same_files(single_reference / "final-0.pt", tmp_path / "b" / "final-0.pt")


def test_flipped_byte_in_a_dcp_shard_is_caught(tmp_path: Path, ddp_reference: Path) -> None:
    """The same for the multi-rank format (DCP), whose files are hashed as DCP writes them."""
    env = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR="")
    proc = start(torchrun_argv(tmp_path / "a"), env, tmp_path / "a.log")
    assert finish(proc) == 0, tail_of(proc)
    newest = tmp_path / "persistent" / "checkpoint-35"
    manifest = read_manifest(newest)
    assert manifest.extra["kubeckpt"]["format"] == "dcp"
    assert all(f.xxh3_128 for f in manifest.files)  # hashed while written, with XXH3
    assert layout.verify_checkpoint(newest, checksums=True)[1] == []
    shard = max(newest.glob("__*_*.distcp"), key=lambda p: p.stat().st_size)
    _flip_middle_byte(shard)
    proc = start(torchrun_argv(tmp_path / "b"), env, tmp_path / "b.log")
    assert finish(proc) == 0, tail_of(proc)
    for rank in range(2):
        info = json.loads((tmp_path / "b" / f"exit-{rank}.json").read_text())
        assert info["resumed_from"] == "checkpoint-28", (rank, info)
        assert_same_files(ddp_reference / f"final-{rank}.pt", tmp_path / "b" / f"final-{rank}.pt")
    log = (tmp_path / "b.log").read_text()
    assert f"checksum mismatch: {shard.name}" in log, log[-3000:]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_recreated_job_keeps_its_checkpoints_and_resumes_from_the_newest_generation(
    tmp_path: Path, single_reference: Path
) -> None:
    """Re-created with resume "false" (a new pod: an empty ramdisk), the job writes steps 7 and
    14 into generation-1/ beside 21/28/35 and deletes none of them; re-created again with the
    default it resumes from generation-1/checkpoint-14 (newest by commit order, though 35 is a
    higher step) and ends where the uninterrupted run ends."""
    persistent = tmp_path / "persistent"
    train(steps=STEPS, status_dir=tmp_path / "a", environ=ckpt_env(tmp_path))
    assert _steps(persistent) == [(21, True), (28, True), (35, True)]
    before = _files(persistent)

    fresh = ckpt_env(
        tmp_path, CHECKPOINT_RESUME="false", CHECKPOINT_LOCAL_DIR=str(tmp_path / "local-b")
    )
    info = train(steps=16, status_dir=tmp_path / "b", environ=fresh)
    assert info["resumed_from"] is None and info["failed_saves"] == 0, info
    assert _steps(persistent / "generation-1") == [(7, True), (14, True)]
    assert _steps(tmp_path / "local-b") == [(15, True)]
    assert {k: v for k, v in _files(persistent).items() if k in before} == before
    assert read_manifest(persistent / "generation-1" / "checkpoint-14").generation == 1

    again = ckpt_env(tmp_path, CHECKPOINT_LOCAL_DIR=str(tmp_path / "local-c"))
    info = train(steps=STEPS, status_dir=tmp_path / "c", environ=again)
    assert (info["resumed_from"], info["resumed_tier"]) == (
        "generation-1/checkpoint-14",
        "persistent",
    )
    assert_same_files(single_reference / "final-0.pt", tmp_path / "c" / "final-0.pt")
    # It went on in generation 1 (the newest 3 by commit order kept there); generation 0 as it was.
    assert _steps(persistent / "generation-1") == [(21, True), (28, True), (35, True)]
    assert {k: v for k, v in _files(persistent).items() if k in before} == before
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["resumedFrom"] == "generation-1/checkpoint-14"
