"""Checkpoint files written around the page cache (trainer_runtime/direct_write.py): every kind of
piece (aligned, unaligned, small, past a bounce buffer's end, a gap) lands where it should, the
digest is the file's, nothing stays in the page cache, and a filesystem that refuses O_DIRECT
still gets the whole file.

On the local disk (pytest's tmp_path): the page-cache checks need a filesystem that honours
O_DIRECT (tmpfs keeps every page), which the test says if it is not one."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainer_runtime import direct_write
from trainer_runtime.contract import hash_file, new_hasher, preferred_checksum
from trainer_runtime.direct_write import ALIGN, Bounce, HashedFile
from trainer_runtime.storage import LocalTier, S3Tier
from trainer_runtime.torch import plain
from trainer_runtime.torch.staging import Stager, host_buffer

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
_libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def cached_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache (mincore on a mapping of it)."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        try:
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(addr, size)
        return sum(b & 1 for b in vec)
    finally:
        os.close(fd)


_RANDOM = random.Random(0)


def aligned_bytes(data: bytes) -> memoryview:
    view = memoryview(mmap.mmap(-1, len(data)))
    view[:] = data
    return view


def unaligned_bytes(data: bytes) -> memoryview:
    buf = bytearray(len(data) + 1)
    buf[1:] = data
    return memoryview(buf)[1:]


def pieces() -> list[tuple[int, memoryview]]:
    """(offset, bytes) in file order, the same bytes on every call: a small unaligned tensor,
    an aligned one whose tail is not a whole block, an unaligned one larger than the bounce
    buffer, an aligned one larger than a direct write, a small last one; zeros between some."""
    sizes_and_kinds = [
        (100, unaligned_bytes),
        (2 * ALIGN + 808, aligned_bytes),
        (direct_write.BOUNCE_BYTES + 3, unaligned_bytes),
        (direct_write.DIRECT_PIECE + 5 * ALIGN, aligned_bytes),
        (77, unaligned_bytes),
    ]
    out: list[tuple[int, memoryview]] = []
    _RANDOM.seed(0)
    at = 0
    for size, kind in sizes_and_kinds:
        if size >= ALIGN:
            at = -(-at // ALIGN) * ALIGN
        out.append((at, kind(_RANDOM.randbytes(size))))
        at += size
    return out


def write(path: Path, bounce: Bounce | None) -> tuple[HashedFile, bytes, str]:
    """The pieces written to `path`; the writer (closed), the bytes expected, the digest."""
    expected = bytearray()
    algorithm = preferred_checksum()
    f = HashedFile(path, new_hasher(algorithm), bounce)
    try:
        for offset, view in pieces():
            expected += bytes(offset - len(expected)) + bytes(view)
            f.write_at(offset, view)
        f.finish()
    finally:
        f.close()
    return f, bytes(expected), f.digest.hexdigest()


def needs_direct_io(path: Path) -> None:
    """A block written with O_DIRECT must not stay in the page cache (tmpfs keeps it)."""
    probe = path / "probe"
    f = HashedFile(probe, new_hasher(preferred_checksum()), Bounce(ALIGN))
    try:
        f.write_at(0, memoryview(b"x" * ALIGN))
        f.finish()
    finally:
        f.close()
    assert f.direct and cached_pages(probe) == 0, (
        f"{path} does not write around the page cache (tmpfs?): run the tests with a "
        "disk-backed temporary directory (pytest --basetemp=DIR)"
    )
    probe.unlink()


def test_every_kind_of_piece_lands_in_place_hashed_and_around_the_page_cache(
    tmp_path: Path,
) -> None:
    needs_direct_io(tmp_path)
    bounce = Bounce()
    try:
        f, expected, digest = write(tmp_path / "direct.bin", bounce)
    finally:
        bounce.close()
    target = tmp_path / "direct.bin"
    assert target.read_bytes() == expected  # reads it into the page cache: after the check below
    assert f.direct, "the filesystem took O_DIRECT, and the writer kept it to the end"
    assert digest == hash_file(target, preferred_checksum())[1]
    assert f.size == len(expected) == target.stat().st_size


def test_a_direct_write_leaves_nothing_in_the_page_cache_a_buffered_one_does(
    tmp_path: Path,
) -> None:
    needs_direct_io(tmp_path)
    bounce = Bounce()
    try:
        write(tmp_path / "direct.bin", bounce)
    finally:
        bounce.close()
    _, expected, digest = write(tmp_path / "buffered.bin", None)
    assert cached_pages(tmp_path / "direct.bin") == 0
    assert cached_pages(tmp_path / "buffered.bin") > len(expected) // mmap.PAGESIZE // 2
    assert (tmp_path / "direct.bin").read_bytes() == (tmp_path / "buffered.bin").read_bytes()
    assert digest == hash_file(tmp_path / "direct.bin", preferred_checksum())[1]


def _refusing(errno_: int, after: int = 0) -> Callable[..., int]:
    """os.pwrite that fails with `errno_` on a file opened with O_DIRECT, after `after` calls."""
    real = os.pwrite
    calls = [0]

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        calls[0] += 1
        if calls[0] > after and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno_, os.strerror(errno_))
        return real(fd, data, offset)

    return pwrite


@pytest.mark.parametrize("after", [0, 2], ids=["at-the-first-write", "after-two-writes"])
def test_a_filesystem_that_refuses_direct_writes_gets_the_file_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    monkeypatch.setattr(os, "pwrite", _refusing(errno.EINVAL, after))
    bounce = Bounce()
    try:
        f, expected, digest = write(tmp_path / "f.bin", bounce)
    finally:
        bounce.close()
    assert not f.direct
    assert (tmp_path / "f.bin").read_bytes() == expected
    assert digest == hash_file(tmp_path / "f.bin", preferred_checksum())[1]


def test_a_full_disk_fails_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "pwrite", _refusing(errno.ENOSPC))
    bounce = Bounce()
    try:
        with pytest.raises(OSError) as e:
            write(tmp_path / "f.bin", bounce)
    finally:
        bounce.close()
    assert e.value.errno == errno.ENOSPC


def test_bytes_before_the_end_are_refused(tmp_path: Path) -> None:
    f = HashedFile(tmp_path / "f.bin", new_hasher(preferred_checksum()), None)
    try:
        f.write_at(0, memoryview(b"abcd"))
        with pytest.raises(ValueError, match="before the end"):
            f.write_at(2, memoryview(b"x"))
    finally:
        f.close()


def test_staging_buffers_are_aligned_and_own_exactly_their_bytes() -> None:
    for shape, dtype in [
        ((1024, 3), torch.float32),
        ((4097,), torch.bfloat16),
        ((5,), torch.int64),
    ]:
        buf = host_buffer(shape, dtype, pin=False)
        assert buf.shape == shape and buf.dtype == dtype and buf.is_contiguous()
        # DCP's writer clones a tensor whose storage is larger than itself.
        assert buf.untyped_storage().nbytes() == buf.numel() * buf.element_size()
        if buf.numel() * buf.element_size() >= ALIGN:
            assert buf.data_ptr() % ALIGN == 0


def test_a_staged_save_puts_large_tensors_on_blocks_and_bypasses_the_page_cache(
    tmp_path: Path,
) -> None:
    needs_direct_io(tmp_path)
    gen = torch.Generator().manual_seed(0)
    tree = {
        "step": torch.tensor(7),
        "w": torch.randn(300, 301, generator=gen),
        "b": torch.randn(3, generator=gen),
        "h": torch.randn(1000, generator=gen).to(torch.bfloat16),
        "v": torch.randn(512, 64, generator=gen),
    }
    staged = Stager().stage(tree)
    staged.wait()
    files = plain.write_rank(tmp_path, 0, staged.tree, {"step": 7})
    meta = plain.read_state(tmp_path, 0)
    for entry in meta["index"]:
        if entry["nbytes"] >= ALIGN:
            assert entry["offset"] % ALIGN == 0, entry
    shard = tmp_path / plain.tensors_file(0)
    assert cached_pages(shard) == 0
    for f in files:
        assert f.checksum.endswith(hash_file(tmp_path / f.path, preferred_checksum())[1])
    back = plain.read_rank(tmp_path, 0, None, meta)
    for key, t in tree.items():
        assert torch.equal(back[key], t), key


def test_files_laid_out_back_to_back_before_the_alignment_still_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of an older runtime (no gaps: every tensor right after the one before)."""
    tree = {"a": torch.randn(3), "w": torch.randn(100, 33), "v": torch.randn(2000)}
    monkeypatch.setattr(plain, "ALIGN", 1)  # the old layout
    plain.write_rank(tmp_path, 0, tree, {"step": 1})
    monkeypatch.undo()
    meta = plain.read_state(tmp_path, 0)
    offsets = [e["offset"] for e in meta["index"]]
    assert offsets == [0, 12, 12 + 100 * 33 * 4]  # back to back, as the old writer left them
    back = plain.read_rank(tmp_path, 0, {k: torch.zeros_like(v) for k, v in tree.items()}, meta)
    for key, t in tree.items():
        assert torch.equal(back[key], t), key


def test_files_a_tier_reads_back_to_upload_are_written_through_the_page_cache(
    tmp_path: Path,
) -> None:
    """s3://: the writer's files are uploaded from the staging directory right after the save,
    so they are written buffered and the upload reads them from memory."""
    needs_direct_io(tmp_path)
    assert S3Tier.read_back and not LocalTier(tmp_path, "persistent").read_back
    staged = Stager().stage({"w": torch.randn(512, 64)})
    staged.wait()
    plain.write_rank(tmp_path, 0, staged.tree, {}, around_page_cache=False)
    shard = tmp_path / plain.tensors_file(0)
    assert cached_pages(shard) == shard.stat().st_size // mmap.PAGESIZE
