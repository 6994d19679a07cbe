"""Retention by commit order and generations (trainer_runtime/generations.py), through the one
save protocol every adapter uses (simulated ranks, tests/support/toy_ranks.py), on a directory
tier, and the pure decisions under it.

The issue's scenario: a job wrote steps 3000/4000/5000 (keep 3) and is re-created under the same
name with `kubeckpt.io/resume: "false"` (CHECKPOINT_RESUME=false). Retention by step number
deleted every new checkpoint, its just-in-time save included, as soon as it was written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.simulated_ranks import run_ranks
from tests.support.toy_ranks import Job, ToyLoader, ToySave
from trainer_runtime import generations, layout
from trainer_runtime.contract import (
    MANIFEST_GENERATION,
    MANIFEST_SEQUENCE,
    ContractError,
    Manifest,
    build_manifest,
    read_manifest,
)
from trainer_runtime.generations import Entry


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """(size, mtime, content) of every file under `root`: what "untouched" means."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath, name)
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, p.read_bytes())
    return out


def complete(root: Path) -> list[tuple[int, int]]:
    """(generation, step) of every complete checkpoint under `root`."""
    return [(e.generation, e.step) for e in layout.scan(root) if e.complete]


def saves(j: Job, steps: list[int], *, restore: bool = True, jit_at: int | None = None) -> list:
    """Every rank: restore (as adapters do first), then a periodic save at each step, then a
    just-in-time stop at `jit_at`. Returns what each rank restored."""

    def rank(r: int) -> Any:
        ckpt = j.ckpts[r]
        restored = ckpt.restore(ToyLoader(r)) if restore else None
        for step in steps:
            ckpt.save(step, lambda s=step: ToySave(r, [s, r]), blocking=True)
        if jit_at is not None:
            assert j.stops[r].save_at(jit_at, lambda: ToySave(r, [jit_at, r]))
        return restored

    return run_ranks(j.n, rank)


def test_a_recreated_job_with_resume_false_keeps_every_checkpoint(job, tmp_path: Path) -> None:
    """3000/4000/5000 kept 3; the new run writes 100 and a just-in-time save at 150: all of them
    survive, and the old ones are not touched."""
    root = tmp_path / "ckpt"
    saves(job(2, CHECKPOINT_MAX_CHECKPOINTS="3"), [3000, 4000, 5000])
    assert complete(root) == [(0, 3000), (0, 4000), (0, 5000)]
    before = snapshot(root)

    new = job(2, CHECKPOINT_MAX_CHECKPOINTS="3", CHECKPOINT_RESUME="false")
    assert saves(new, [100], jit_at=150) == [None, None]  # nothing resumed
    assert complete(root) == [(0, 3000), (0, 4000), (0, 5000), (1, 100), (1, 150)]
    assert {k: v for k, v in snapshot(root).items() if k in before} == before
    jit = read_manifest(root / "generation-1" / "checkpoint-150")
    assert jit.extra["reason"] == "jit" and jit.generation == 1
    assert jit.sequence > read_manifest(root / "checkpoint-5000").sequence
    # The answer preStop got names the new generation's checkpoint.
    assert new.ckpts[0].durable_location == str(root / "generation-1" / "checkpoint-150")

    # Retention goes on in the new generation only, by commit order.
    more = job(2, CHECKPOINT_MAX_CHECKPOINTS="3")  # resumes (the default) from 150
    assert [r.step for r in saves(more, [160, 170])] == [150, 150]
    assert complete(root) == [
        (0, 3000), (0, 4000), (0, 5000), (1, 150), (1, 160), (1, 170)
    ]  # fmt: skip
    assert {k: v for k, v in snapshot(root).items() if k in before} == before


def test_a_recreated_job_resumes_by_default_from_the_newest_across_generations(
    job, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    saves(job(1), [3000, 4000, 5000])
    saves(job(1, CHECKPOINT_RESUME="false"), [100, 200])  # generation 1, lower steps
    restored = saves(job(1), [300])
    assert [(r.step, r.generation, r.location) for r in restored] == [
        (200, 1, str(root / "generation-1" / "checkpoint-200"))
    ]
    assert (1, 300) in complete(root)  # it goes on writing in that generation
    assert job(1).ckpts[0].restore(ToyLoader(0)).step == 300


def test_resume_false_on_an_empty_root_writes_the_root(job, tmp_path: Path) -> None:
    """Nothing to keep apart from: no generation directory for a new job."""
    saves(job(1, CHECKPOINT_RESUME="false"), [10])
    assert complete(tmp_path / "ckpt") == [(0, 10)]
    assert not (tmp_path / "ckpt" / "generation-1").exists()


def test_resumed_from_an_older_checkpoint_its_new_commits_outlive_the_corrupt_newest(
    job, tmp_path: Path
) -> None:
    """The newest checkpoint is corrupt, so the run resumes from the one before and writes
    lower steps than it: by commit order its new checkpoints are the newest, and the corrupt
    and older ones are deleted before them (by step number, each new one went first)."""
    root = tmp_path / "ckpt"
    saves(job(1, CHECKPOINT_MAX_CHECKPOINTS="3"), [3000, 4000, 5000])
    (root / "checkpoint-5000" / "rank-0.json").write_text("[5001, 0]")  # same size, other bits
    run = job(1, CHECKPOINT_MAX_CHECKPOINTS="2")
    restored = saves(run, [4002])
    assert restored[0].step == 4000
    assert complete(root) == [(0, 4002), (0, 5000)]
    run.ckpts[0].save(4004, lambda: ToySave(0, [4004, 0]), blocking=True)
    assert complete(root) == [(0, 4002), (0, 4004)]  # the corrupt one went, not a new one


def test_nothing_loadable_starts_a_new_generation_and_deletes_nothing(job, tmp_path: Path) -> None:
    """Complete checkpoints none of which this run can load (another world size, a checksum
    it cannot compute, corruption): they may be another run's only copy, so it writes beside
    them."""
    root = tmp_path / "ckpt"
    saves(job(1, CHECKPOINT_MAX_CHECKPOINTS="1"), [30])
    (root / "checkpoint-30" / "rank-0.json").write_text("[31, 0]")
    # Starting fresh over checkpoints none of which verifies is the policy's choice (issue 27).
    fresh = job(1, CHECKPOINT_MAX_CHECKPOINTS="1", CHECKPOINT_ON_UNVERIFIABLE="StartFresh")
    assert saves(fresh, [1, 2]) == [None]
    assert complete(root) == [(0, 30), (1, 2)]


def test_an_adapter_that_saves_without_restoring_still_plans_the_generation(
    job, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    saves(job(2), [50])
    saves(job(2, CHECKPOINT_RESUME="false"), [5], restore=False)
    assert complete(root) == [(0, 50), (1, 5)]


def test_the_local_tier_has_no_generations_and_keeps_the_newest_by_commit_order(
    job, tmp_path: Path
) -> None:
    """The ramdisk holds one checkpoint and one being written: a run that does not resume
    replaces an earlier run's copy there (never its own new one), and its copy says which
    persistent generation it belongs to, so a restart from it goes on writing there."""
    ramdisk = tmp_path / "ramdisk"

    def with_ramdisk(j: Job) -> Job:
        for c in j.ckpts:
            c.local = type(c.persistent)(str(ramdisk), "local")
            c.schedule.local_enabled = True
        return j

    def both(j: Job, steps: list[int], restore: bool = True) -> list:
        def rank(r: int) -> Any:
            ckpt = j.ckpts[r]
            restored = ckpt.restore(ToyLoader(r)) if restore else None
            for step in steps:
                ckpt.save(step, lambda s=step: ToySave(r, [s, r]), local=True, blocking=True)
            return restored

        return run_ranks(j.n, rank)

    both(with_ramdisk(job(1)), [5000])
    both(with_ramdisk(job(1, CHECKPOINT_RESUME="false")), [100])
    assert complete(ramdisk) == [(0, 100)]
    assert read_manifest(ramdisk / "checkpoint-100").generation == 1
    restored = both(with_ramdisk(job(1)), [110])
    assert (restored[0].step, restored[0].tier.name, restored[0].generation) == (100, "local", 1)
    assert (1, 110) in complete(tmp_path / "ckpt")


def test_a_failed_retention_never_undoes_the_commit(
    job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    saves(job(1, CHECKPOINT_MAX_CHECKPOINTS="1"), [10])

    def broken(*a: Any, **k: Any) -> list[int]:
        raise OSError("EIO")

    monkeypatch.setattr(layout, "retain", broken)
    j = job(1, CHECKPOINT_MAX_CHECKPOINTS="1")
    saves(j, [20])
    assert j.ckpts[0].failed_saves == 0
    assert complete(root) == [(0, 10), (0, 20)]


# --- the pure decisions -------------------------------------------------------------------------


def e(step: int, seq: int | None, gen: int = 0, done: bool = True) -> Entry:
    return Entry(step=step, complete=done, generation=gen, sequence=seq)


def test_retention_is_by_commit_order_within_one_generation() -> None:
    entries = [e(3000, 1), e(4000, 2), e(5000, 3), e(100, 4), e(200, 5), e(9, 1, gen=1)]
    assert [x.step for x in generations.expired(entries, 0, 3)] == [3000, 4000]
    assert [x.step for x in generations.expired(entries, 1, 0)] == []  # the newest always stays
    # Manifests without a sequence (before it existed) are older than any with one, by step.
    legacy = [e(3000, None), e(5000, None), e(100, 1)]
    assert [x.step for x in generations.expired(legacy, 0, 2)] == [3000]
    assert [x.step for x in generations.expired([e(7, None, done=False)], 0, 0)] == []


def test_the_next_sequence_is_above_the_generation_and_the_runs_own_count() -> None:
    assert generations.next_sequence(1, []) == 1
    assert generations.next_sequence(4, [e(1, 9)]) == 10  # another writer committed meanwhile
    assert generations.next_sequence(12, [e(1, 9), e(2, None)]) == 12


@pytest.mark.parametrize(
    ("entries", "kw", "expected"),
    [
        ([], {"resume": False}, 0),
        ([e(5, None, done=False)], {"resume": False}, 0),
        ([e(5, 1)], {"resume": False}, 1),
        ([e(5, 1), e(1, 2, gen=3)], {"resume": False, "existing": {0, 3, 4}}, 5),
        ([e(5, 1), e(1, 2, gen=1)], {"resume": True, "resumed": True, "restored": 0}, 0),
        ([e(5, 1), e(1, 2, gen=1)], {"resume": True, "resumed": True, "restored": None}, 1),
        ([e(5, 1)], {"resume": True}, 1),  # nothing could be loaded: delete nothing
        ([], {"resume": True, "existing": {0, 2}}, 2),
    ],
)
def test_which_generation_a_run_writes(entries: list[Entry], kw: dict, expected: int) -> None:
    assert generations.choose_generation(entries, **kw) == expected


def test_the_manifest_keys_are_checked(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"a")
    base = dict(step=1, epoch=0, world_size=1, framework="t", tier="persistent")
    m = build_manifest(tmp_path, **base, extra={MANIFEST_SEQUENCE: 7, MANIFEST_GENERATION: 2})
    again = Manifest.from_json(m.to_json())
    assert (again.sequence, again.generation) == (7, 2)
    assert build_manifest(tmp_path, **base).sequence is None
    for bad in ({MANIFEST_SEQUENCE: 0}, {MANIFEST_SEQUENCE: "7"}, {MANIFEST_GENERATION: -1}):
        with pytest.raises(ContractError):
            build_manifest(tmp_path, **base, extra=bad)


def test_the_same_on_s3(job, s3_root, tmp_path: Path) -> None:
    """s3:// (SeaweedFS): the issue's scenario, resume from the newest across generations,
    and the listing of both generations."""
    from trainer_runtime import listing

    fs, uri = s3_root
    prefix = uri.removeprefix("s3://")
    env = {"CHECKPOINT_URI": uri, "CHECKPOINT_MAX_CHECKPOINTS": "3"}
    saves(job(2, **env), [3000, 4000, 5000])
    fs.invalidate_cache()
    old = {k: fs.cat_file(k) for k in fs.find(prefix)}
    assert saves(job(2, **env, CHECKPOINT_RESUME="false"), [100], jit_at=150) == [None, None]
    restored = saves(job(2, **env), [160, 170])
    assert [r.step for r in restored] == [150, 150]
    assert restored[0].location == f"{uri}/generation-1/checkpoint-150"
    fs.invalidate_cache()
    assert {k: fs.cat_file(k) for k in fs.find(prefix) if k in old} == old  # untouched
    doc = listing.listing(uri, None)
    got = [(c["generation"], c["step"], c["state"]) for c in doc["checkpoints"]]
    assert got == [
        (1, 170, "complete"),
        (1, 160, "complete"),
        (1, 150, "complete"),
        (0, 5000, "complete"),
        (0, 4000, "complete"),
        (0, 3000, "complete"),
    ]
    assert [c["sequence"] for c in doc["checkpoints"]] == [7, 6, 5, 3, 2, 1]


def test_the_sequence_is_read_without_validating_every_file() -> None:
    from trainer_runtime.contract import sequence_of

    assert sequence_of(b'{"sequence": 4, "files": [{"path": "../x"}]}') == 4
    for bad in (b"{", b"[]", b'{"sequence": 0}', b'{"sequence": true}', b'{"sequence": 1.5}'):
        assert sequence_of(bad) is None
    assert sequence_of(b'{"sequence": NaN}') is None
