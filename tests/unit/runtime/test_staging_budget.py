"""Bounded staging (issue 27 item 3): the budget's arithmetic, where the memory figures come from,
the chunk plan, and a chunked write that gives the same files as a whole one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from trainer_runtime.config import Config
from trainer_runtime.contract import ContractError
from trainer_runtime.staging_budget import (
    MARGIN_MIN,
    MIN_CHUNK,
    KernelFiles,
    Memory,
    MiB,
    Span,
    budget,
    budget_from,
    chunk_capacity,
    plan_chunks,
    read_memory,
    staging_budget,
)
from trainer_runtime.torch import plain
from trainer_runtime.torch.staging import Chunked, Stager

GiB = 1024 * MiB


# ---------------------------------------------------------------------------- the budget


def test_budget_is_the_room_beside_the_working_set_minus_the_margin() -> None:
    # 16 GiB limit, 6 GiB in use: 10 GiB free, less 10 % of the limit (above the 256 MiB floor).
    assert budget(16 * GiB, 6 * GiB) == 10 * GiB - int(16 * GiB * 0.10)


def test_inactive_page_cache_counts_as_free() -> None:
    # What the kubelet counts (usage - inactive_file): a checkpoint just written fills the page
    # cache, which the kernel drops before it OOM-kills.
    assert budget(16 * GiB, 10 * GiB, reclaimable=4 * GiB) == budget(16 * GiB, 6 * GiB)


def test_buffers_already_held_are_part_of_the_budget() -> None:
    # The stager's buffers from the last save are in `usage` and reused by the next one.
    assert budget(16 * GiB, 8 * GiB, held=2 * GiB) == budget(16 * GiB, 6 * GiB)


def test_small_limits_keep_the_margin_floor_and_never_go_negative() -> None:
    assert budget(1 * GiB, 0) == 1 * GiB - MARGIN_MIN
    assert budget(1 * GiB, 900 * MiB) == 0
    assert budget(1 * GiB, 5 * GiB) == 0


def test_bad_figures_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        budget(-1, 0)


def test_no_limit_uses_mem_available() -> None:
    assert budget_from(Memory(None, available=8 * GiB)) == budget(8 * GiB, 0)
    with pytest.raises(ValueError, match="nothing to size staging by"):
        budget_from(Memory(None))


# ---------------------------------------------------------------------------- the thin shell


def _files(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_reads_cgroup_v2(tmp_path: Path) -> None:
    v2 = _files(
        tmp_path / "v2",
        {
            "memory.max": f"{8 * GiB}\n",
            "memory.current": f"{3 * GiB}\n",
            "memory.stat": f"anon 123\ninactive_file {1 * GiB}\nactive_file 5\n",
        },
    )
    got = read_memory(v2, tmp_path / "none", tmp_path / "none")
    assert got == Memory(8 * GiB, 3 * GiB, 1 * GiB)


def test_cgroup_v2_without_limit_falls_back_to_meminfo(tmp_path: Path) -> None:
    v2 = _files(tmp_path / "v2", {"memory.max": "max\n", "memory.current": "100\n"})
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  32000000 kB\nMemAvailable:  2000000 kB\n")
    got = read_memory(v2, tmp_path / "none", meminfo)
    assert got == Memory(None, available=2_000_000 * 1024)


def test_reads_cgroup_v1_and_ignores_its_unlimited_value(tmp_path: Path) -> None:
    v1 = _files(
        tmp_path / "v1",
        {
            "memory.limit_in_bytes": f"{4 * GiB}\n",
            "memory.usage_in_bytes": f"{1 * GiB}\n",
            "memory.stat": "total_inactive_file 1000\n",
        },
    )
    assert read_memory(tmp_path / "none", v1, tmp_path / "none") == Memory(4 * GiB, 1 * GiB, 1000)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert read_memory(tmp_path / "none", v1, tmp_path / "none") == Memory(None)


def test_kept_open_files_are_read_anew_each_time(tmp_path: Path) -> None:
    # What every save reads: the cgroup's files through descriptors kept open. A limit changed
    # in place (an in-place pod resize) and a new usage must show at the next read.
    v2 = _files(
        tmp_path / "v2",
        {
            "memory.max": f"{8 * GiB}\n",
            "memory.current": f"{3 * GiB}\n",
            "memory.stat": "inactive_file 7\n" + "".join(f"x{i} {i}\n" for i in range(9000)),
        },
    )
    files = KernelFiles()
    try:
        got = read_memory(v2, tmp_path / "none", tmp_path / "none", read=files.read)
        assert got == Memory(8 * GiB, 3 * GiB, 7)
        (v2 / "memory.max").write_text(f"{16 * GiB}\n")  # rewritten in place, shorter or longer
        (v2 / "memory.current").write_text(f"{12 * GiB}\n")
        got = read_memory(v2, tmp_path / "none", tmp_path / "none", read=files.read)
        assert got == Memory(16 * GiB, 12 * GiB, 7)
        # memory.stat is past one 64 KiB read here: read whole.
        assert files.read(v2 / "memory.stat") == (v2 / "memory.stat").read_text()
        assert files.read(tmp_path / "none" / "memory.max") is None
        (v2 / "memory.max").write_text("max\n")
        meminfo = tmp_path / "meminfo"
        meminfo.write_text("MemAvailable:  2000000 kB\n")
        got = read_memory(v2, tmp_path / "none", meminfo, read=files.read)
        assert got == Memory(None, available=2_000_000 * 1024)
    finally:
        files.close()
    # This process's own figures, read either way, agree (the same files, moments apart).
    own = KernelFiles()
    fresh, kept = read_memory(), read_memory(read=own.read)
    own.close()
    assert (fresh.limit, fresh.available is None) == (kept.limit, kept.available is None)


def test_the_override_wins() -> None:
    assert staging_budget(12345) == 12345
    assert staging_budget(0) == 0


# ---------------------------------------------------------------------------- configuration


def test_budget_variable_is_parsed_and_checked() -> None:
    assert Config.from_env({}).staging_budget_bytes is None
    cfg = Config.from_env({"KUBECKPT_STAGING_BUDGET_BYTES": "1073741824"})
    assert cfg.staging_budget_bytes == GiB
    for bad in ("1G", "-5", "lots"):
        with pytest.raises(ContractError) as err:
            Config.from_env({"KUBECKPT_STAGING_BUDGET_BYTES": bad})
        assert err.value.field == "KUBECKPT_STAGING_BUDGET_BYTES"
    with pytest.raises(ContractError):
        Config.from_env({}, staging_budget_bytes=-1)


# ---------------------------------------------------------------------------- the chunk plan


def _covered(sizes: list[int], chunks: list[list[Span]]) -> list[tuple[int, int, int]]:
    return [(s.tensor, s.start, s.stop) for chunk in chunks for s in chunk]


@pytest.mark.parametrize(
    ("sizes", "capacity"),
    [([10, 20, 30], 25), ([100], 7), ([0, 5, 0, 5], 4), ([3, 3, 3], 3), ([1, 2, 3], 100)],
)
def test_chunks_cover_every_byte_once_in_order_within_capacity(
    sizes: list[int], capacity: int
) -> None:
    chunks = plan_chunks(sizes, capacity)
    spans = _covered(sizes, chunks)
    expected_next = {i: 0 for i in range(len(sizes))}
    order = []
    for tensor, start, stop in spans:
        assert start == expected_next[tensor] and stop > start
        expected_next[tensor] = stop
        order.append(tensor)
    assert expected_next == dict(enumerate(sizes))
    assert order == sorted(order)
    for chunk in chunks:
        used = sum(s.nbytes for s in chunk)
        assert 0 < used <= capacity
        offsets = [s.offset for s in chunk]
        assert offsets == [sum(s.nbytes for s in chunk[:k]) for k in range(len(chunk))]
    # Every chunk but the last is full: the fewest chunks for the capacity.
    assert all(sum(s.nbytes for s in c) == capacity for c in chunks[:-1])


def test_chunk_plan_edge_cases() -> None:
    assert plan_chunks([], 10) == []
    assert plan_chunks([0, 0], 10) == []
    with pytest.raises(ValueError, match="capacity"):
        plan_chunks([1], 0)


def test_chunk_capacity_is_the_budget_with_a_floor() -> None:
    assert chunk_capacity(100 * MiB, 10 * MiB) == 10 * MiB
    assert chunk_capacity(100 * MiB, 0) == MIN_CHUNK
    assert chunk_capacity(100, 10 * MiB) == 100  # never more than the state


# ---------------------------------------------------------------------------- chunked writes


def _tree() -> dict:
    gen = torch.Generator().manual_seed(3)
    return {
        "model": {
            "w": torch.randn(700, 900, generator=gen),  # 2.4 MiB: split across chunks
            "b": torch.randn(33, generator=gen, dtype=torch.float64),
            "half": torch.randn(40, 40, generator=gen).to(torch.bfloat16),
            "empty": torch.empty(0),
            "n": torch.tensor(7),
            "t": torch.randn(50, 60, generator=gen).t(),  # not contiguous: staged whole
        },
        "optim": {"state": {0: {"m": torch.randn(300, 500, generator=gen)}}},
    }


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def _stream_through(staged: Chunked, tree: dict, directory: Path) -> list:
    directory.mkdir()
    return plain.write_rank(directory, 0, staged.tree, {"step": 3}, stream=staged.stream)


@pytest.mark.parametrize("budget_bytes", [0, MiB + 12345, 2 * MiB])
def test_a_chunked_write_gives_the_same_files(tmp_path: Path, budget_bytes: int) -> None:
    tree = _tree()
    whole = Stager().stage(tree)
    whole.wait()
    (tmp_path / "whole").mkdir()
    expected = plain.write_rank(tmp_path / "whole", 0, whole.tree, {"step": 3})

    stager = Stager()
    staged = stager.stage_chunked(tree, budget_bytes, late=lambda t: t.dim() == 2)
    staged.wait()
    assert len(staged.buffer) <= max(MIN_CHUNK, budget_bytes)
    got = _stream_through(staged, tree, tmp_path / "chunked")
    assert got == expected
    assert _digests(tmp_path / "chunked") == _digests(tmp_path / "whole")
    assert staged.chunks_copied >= 2
    assert staged.released  # the last write copied its last chunk
    # It reads back the same.
    meta = plain.read_state(tmp_path / "chunked", 0)
    back = plain.read_rank(tmp_path / "chunked", 0, {}, meta)
    for key, t in tree["model"].items():
        assert torch.equal(back["model"][key], t), key


def test_training_waits_until_the_last_planned_write_copied_its_last_chunk(
    tmp_path: Path,
) -> None:
    tree = _tree()
    staged = Stager().stage_chunked(tree, 0)
    staged.planned(2)  # two tiers
    assert staged.pending_late
    _stream_through(staged, tree, tmp_path / "one")
    staged.wrote()
    assert not staged.released  # the second tier still reads the live tensors
    _stream_through(staged, tree, tmp_path / "two")
    assert staged.released
    assert _digests(tmp_path / "one") == _digests(tmp_path / "two")


def test_a_failed_save_releases_training() -> None:
    staged = Stager().stage_chunked(_tree(), 0)
    staged.planned(1)
    staged.finished()  # the session ends the save, whatever happened
    staged.wait_before_update()  # returns at once
    assert staged.released


def test_a_blocking_chunked_save_writes_cpu_tensors_from_their_own_memory(tmp_path: Path) -> None:
    tree = _tree()
    staged = Stager().stage_chunked(tree, 0, copy_cpu=False)
    _stream_through(staged, tree, tmp_path / "direct")
    # Only the non-contiguous tensor went through the stager (staged whole); nothing was chunked.
    assert staged.chunks_copied == 0
    whole = Stager().stage(tree)
    whole.wait()
    (tmp_path / "whole").mkdir()
    plain.write_rank(tmp_path / "whole", 0, whole.tree, {"step": 3})
    assert _digests(tmp_path / "direct") == _digests(tmp_path / "whole")


def test_going_chunked_gives_up_the_full_size_buffers() -> None:
    tree = _tree()
    stager = Stager()
    stager.stage(tree).wait()
    full = stager.held_bytes
    assert full >= stager.stage_bytes(tree)
    stager.stage_chunked(tree, MiB)
    assert stager.held_bytes < full / 2
