"""The per-rank checkpoint format: raw tensor files and one small state file per rank.

`rank-<r>.<k>.tensors` hold the tensors' bytes in order, in shards of about 128 MiB, each tensor of
a block or more starting on a block boundary (direct_write.ALIGN) so it can be written with
O_DIRECT straight from its staging buffer; readers follow the offsets in the index;
`rank-<r>.state.pt` (torch.save, loadable with weights_only=True) holds the tree's skeleton, each
tensor's shard/offset/dtype/shape and the small per-rank state. Used for single-process jobs and
for the local (ramdisk) tier, which only ever serves the same rank on the same node. It writes at
disk speed around the page cache, hashing each piece just before writing it, and restores by
reading straight into the existing parameters (no intermediate copy)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..contract import (
    HASH_CHUNK_BYTES,
    SHA256,
    ContentMismatch,
    Manifest,
    ManifestFile,
    checksum_available,
    content_problem,
    format_checksum,
    new_hasher,
    preferred_checksum,
)
from ..direct_write import ALIGN, Bounce, HashedFile
from ..fsutil import lower_thread_priority, write_durable
from .state import TENSOR_REF, fill_skeleton, iter_tensors, local_tensor, skeleton

FORMAT = "kubeckpt-plain/1"
SHARD_BYTES = 128 * 1024 * 1024  # restore verifies shards on several threads
# SHA-256 (the fallback where xxhash is missing) runs at ~1.1 GB/s a core, slower than the disk:
# then shards are hashed on threads beside the writer (hashlib releases the GIL).
HASH_THREADS = min(8, max(2, (os.cpu_count() or 2) // 2))
# Restore reads shards on several threads: from the page cache two copy about twice as fast.
READ_THREADS = min(4, max(2, os.cpu_count() or 2))


def tensors_file(rank: int, shard: int = 0) -> str:
    return f"rank-{rank}.{shard}.tensors"


def state_file(rank: int) -> str:
    return f"rank-{rank}.state.pt"


def _bytes_view(t: torch.Tensor) -> memoryview:
    """The tensor's memory as bytes, without a copy (any dtype, including bfloat16)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


@dataclass(frozen=True)
class WrittenFile:
    path: str  # relative to the checkpoint directory
    size: int
    # contract.format_checksum: a bare SHA-256 hex digest, or "<algorithm>:<hex>" (xxh3_128)
    checksum: str


class _Shard:
    def __init__(
        self, directory: Path, rank: int, number: int, algorithm: str, bounce: Bounce | None
    ) -> None:
        self.name = tensors_file(rank, number)
        self.file = HashedFile(directory / self.name, new_hasher(algorithm), bounce)
        self.hasher = 0


class _Queued:
    """A digest whose updates run on a hash thread, in order (the SHA-256 fallback)."""

    def __init__(self, pool: ThreadPoolExecutor, digest: Any, pending: list[Future[None]]):
        self._pool, self._digest, self._pending = pool, digest, pending

    def update(self, data: memoryview) -> None:
        self._pending.append(self._pool.submit(self._digest.update, data))

    def hexdigest(self) -> str:
        return str(self._digest.hexdigest())


def _layout(tensors: list[torch.Tensor]) -> tuple[list[dict[str, Any]], list[int]]:
    """Each tensor's index entry (shard, offset, size, dtype, shape) and each shard's size:
    tensors in order, one of ALIGN bytes or more on an ALIGN boundary (the zeros before it are
    part of the file), a new shard where the next would take one past SHARD_BYTES."""
    index: list[dict[str, Any]] = []
    shard_sizes: list[int] = []
    for t in map(local_tensor, tensors):  # a DTensor: this rank's shard, as staged
        size = t.numel() * t.element_size()
        if not shard_sizes or (shard_sizes[-1] and shard_sizes[-1] + size > SHARD_BYTES):
            shard_sizes.append(0)
        offset = shard_sizes[-1]
        if size >= ALIGN:
            offset = -(-offset // ALIGN) * ALIGN
        index.append(
            {
                "file": len(shard_sizes) - 1,
                "offset": offset,
                "nbytes": size,
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
            }
        )
        shard_sizes[-1] = offset + size
    return index, shard_sizes


def _whole(tensors: list[torch.Tensor]) -> Iterator[tuple[int, int, memoryview]]:
    """Each staged tensor's bytes, whole."""
    for i, t in enumerate(map(local_tensor, tensors)):
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("plain format needs contiguous CPU tensors (stage first)")
        yield i, 0, _bytes_view(t)


# (the tensors in skeleton order) -> (tensor number, byte offset in it, bytes), in order
ByteStream = Callable[[list[torch.Tensor]], Iterator[tuple[int, int, memoryview]]]


def write_rank(
    directory: Path,
    rank: int,
    tensor_tree: Any,
    small_state: dict[str, Any],
    *,
    stream: ByteStream | None = None,
    around_page_cache: bool = True,
) -> list[WrittenFile]:
    """Write and fsync this rank's files; hash while writing. ENOSPC and friends propagate.

    Tensor bytes go to shards of about SHARD_BYTES, written around the page cache where the
    filesystem allows it (direct_write.HashedFile: aligned staged tensors straight from their
    memory, the rest through one bounce buffer), each piece hashed on this thread right before
    it is written (XXH3 at ~13 GB/s). With the SHA-256 fallback, shards are hashed on
    HASH_THREADS threads instead, each shard's hash on one thread, which keeps its updates in
    order; those shards are written buffered, from the tensors' own memory, which stays as it is
    until the hashes are done.

    `around_page_cache=False` writes buffered: files read straight back (an upload from a
    staging directory) are then read from memory, not from the device.

    `stream` supplies the bytes (default: the staged tensors whole); a chunked save's stream
    (staging.Chunked) reuses its buffer once the bytes it gave were written, so its pieces are
    hashed on this thread. The files are the same either way: the layout depends on sizes only.
    """
    lower_thread_priority()  # a background save yields the CPU to training (fsutil.WRITER_NICE)
    algorithm = preferred_checksum()
    skel, tensors = skeleton(tensor_tree)
    index, shard_sizes = _layout(tensors)
    shards: list[_Shard] = []
    pending: list[Future[None]] = []
    threads = HASH_THREADS if algorithm == SHA256 and stream is None else 0
    load = [0] * threads
    hashers = [
        ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kubeckpt-hash{i}")
        for i in range(threads)
    ]
    bounce = Bounce() if around_page_cache and not hashers else None
    try:
        for number in range(len(shard_sizes)):
            shards.append(_Shard(directory, rank, number, algorithm, bounce))
            if hashers:  # a new shard goes to the hash thread with the fewest bytes queued
                shard = shards[-1]
                shard.hasher = min(range(len(hashers)), key=load.__getitem__)
                load[shard.hasher] += shard_sizes[number]
                shard.file.digest = _Queued(hashers[shard.hasher], shard.file.digest, pending)
        current = 0
        for i, start, view in (stream or _whole)(tensors):
            entry = index[i]
            if start + len(view) > entry["nbytes"]:
                raise ValueError(f"tensor {i}: bytes past its end")
            if entry["file"] < current:
                raise ValueError(f"tensor {i}: bytes out of order at {start}")
            while current < entry["file"]:  # the shards share the bounce buffer: one at a time
                shards[current].file.finish(fsync=False)
                current += 1
            shard = shards[entry["file"]]
            at = entry["offset"] + start
            if at < shard.file.size or (start and at != shard.file.size):
                raise ValueError(f"tensor {i}: bytes out of order at {start}")
            shard.file.write_at(at, view)
        for number, (shard, size) in enumerate(zip(shards, shard_sizes, strict=True)):
            if number >= current:
                shard.file.finish(fsync=False)
            if shard.file.size != size:
                raise ValueError(f"{shard.name}: {shard.file.size} bytes written, {size} planned")
        # fsync last: the device has been writing the earlier shards meanwhile.
        for shard in shards:
            os.fsync(shard.file.fd)
    finally:
        for shard in shards:
            shard.file.close()
        for hasher in hashers:
            hasher.shutdown(wait=True)
        if bounce is not None:
            bounce.close()
    for f in pending:
        f.result()
    files = [
        WrittenFile(s.name, s.file.size, format_checksum(algorithm, s.file.digest.hexdigest()))
        for s in shards
    ]
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "skeleton": skel, "index": index, "state": small_state}, buf)
    data = buf.getbuffer()
    digest = new_hasher(algorithm)
    digest.update(data)
    write_durable(directory / state_file(rank), data)
    files.append(
        WrittenFile(state_file(rank), len(data), format_checksum(algorithm, digest.hexdigest()))
    )
    return files


def read_state(directory: Path, rank: int) -> dict[str, Any]:
    with open(directory / state_file(rank), "rb") as f:
        data = torch.load(f, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{state_file(rank)}: not a {FORMAT} state file")
    return data


def shard_files(manifest: Manifest, rank: int) -> dict[int, ManifestFile]:
    """The manifest's entries of `rank`'s tensor shards, by shard number."""
    found = {}
    for f in manifest.files:
        head, dot, tail = f.path.removesuffix(".tensors").rpartition(".")
        if f.path.endswith(".tensors") and dot and head == f"rank-{rank}" and tail.isdigit():
            found[int(tail)] = f
    return found


def read_rank(
    directory: Path,
    rank: int,
    targets: Any,
    meta: dict[str, Any],
    verify: Mapping[int, ManifestFile] | None = None,
) -> Any:
    """The saved tensor tree, read into `targets`' tensors where they match (same path, dtype,
    shape, contiguous CPU; a DTensor's local shard), into new tensors otherwise, then copied
    onto device targets. Shards are read on up to READ_THREADS threads (reads release the GIL).

    The shards in `verify` (by number: restore deferred their content check to this read) are
    read whole, in order, each piece hashed right after it lands, while it is still in the CPU
    cache; a shard that does not match its entry raises ContentMismatch once every shard is
    read. What was read by then is in `targets` already: the caller counts them as touched.
    """
    verify = verify or {}
    target_by_path = dict(iter_tensors(targets))
    paths = _ref_paths(meta["skeleton"])
    index = meta["index"]
    dests: list[tuple[torch.Tensor, torch.Tensor | None, bool, Any]] = []
    reads: dict[int, list[tuple[int, memoryview]]] = {}  # shard -> (offset, destination)
    for i, entry in enumerate(index):
        dtype = getattr(torch, entry["dtype"])
        shape = tuple(entry["shape"])
        original = target_by_path.get(paths[i])
        target = None if original is None else local_tensor(original)
        direct = (
            target is not None
            and target.device.type == "cpu"
            and target.dtype == dtype
            and tuple(target.shape) == shape
            and target.is_contiguous()
        )
        dest = target if direct else torch.empty(shape, dtype=dtype)
        view = _bytes_view(dest)
        if len(view) != entry["nbytes"]:
            raise ValueError(f"{tensors_file(rank, entry['file'])}: tensor {i} has the wrong size")
        if target is not None and not direct and target.shape != dest.shape:
            raise ValueError(
                f"shape mismatch at {paths[i]}: checkpoint {tuple(dest.shape)}, "
                f"model {tuple(target.shape)}"
            )
        reads.setdefault(entry["file"], []).append((entry["offset"], view))
        dests.append((dest, target, direct, original))

    for shard in verify:
        reads.setdefault(shard, [])  # a shard no tensor names is still checked

    def read_shard(shard: int) -> str | None:
        name = tensors_file(rank, shard)
        with open(directory / name, "rb", buffering=0) as f:
            if shard in verify:
                return _read_verified(f, name, reads[shard], verify[shard])
            for offset, view in reads[shard]:
                f.seek(offset)
                _read_into(f, name, view)
        return None

    workers = min(READ_THREADS, len(reads))
    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="kubeckpt-read") as pool:
            found = list(pool.map(read_shard, sorted(reads)))
    else:
        found = [read_shard(shard) for shard in sorted(reads)]
    if problems := [p for p in found if p is not None]:
        raise ContentMismatch(problems)
    loaded: list[torch.Tensor] = []
    for dest, target, direct, original in dests:
        if target is not None and not direct:
            target.copy_(dest)
        # In place: the tree keeps the live (possibly distributed) tensor.
        loaded.append(dest if original is None else original)
    return fill_skeleton(meta["skeleton"], loaded)


def _read_into(f: Any, name: str, view: memoryview) -> None:
    while view:
        n = f.readinto(view)
        if not n:
            raise ValueError(f"{name}: truncated")
        view = view[n:]


def _read_verified(
    f: Any, name: str, reads: list[tuple[int, memoryview]], entry: ManifestFile
) -> str | None:
    """Read a whole shard from its start: the tensors into their destinations, the alignment
    zeros between them into a scratch buffer, hashing every piece after it is read; then what is
    wrong with it against `entry` (None: it matches). Unreadable files raise OSError."""
    algorithm, _ = entry.checksum
    if not checksum_available(algorithm):
        return f"cannot check {algorithm}: {entry.path}: install the xxhash package"
    digest = new_hasher(algorithm)
    scratch = memoryview(bytearray(HASH_CHUNK_BYTES))
    pos = 0
    for offset, view in sorted(reads, key=lambda r: r[0]):
        if offset < pos:
            raise ValueError(f"{name}: tensors overlap at byte {offset}")
        while pos < offset:  # the zeros before an aligned tensor are part of the hash
            gap = scratch[: min(len(scratch), offset - pos)]
            _read_into(f, name, gap)
            digest.update(gap)
            pos += len(gap)
        for start in range(0, len(view), HASH_CHUNK_BYTES):
            piece = view[start : start + HASH_CHUNK_BYTES]
            _read_into(f, name, piece)
            digest.update(piece)
        pos += len(view)
    while n := f.readinto(scratch):  # past the last tensor: only a damaged file has more
        digest.update(scratch[:n])
        pos += n
    return content_problem(entry, pos, digest.hexdigest())


def _ref_paths(skel: Any) -> list[tuple[Any, ...]]:
    """The path of each tensor reference, by reference number."""
    found: dict[int, tuple[Any, ...]] = {}

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if isinstance(node, dict):
            if len(node) == 1 and TENSOR_REF in node:
                found[node[TENSOR_REF]] = path
                return
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, (*path, i))

    walk(skel, ())
    return [found[i] for i in range(len(found))]
