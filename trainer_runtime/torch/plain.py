"""The per-rank checkpoint format: raw tensor files and one small state file per rank.

`rank-<r>.<k>.tensors` hold the tensors' bytes back to back, in shards of about 128 MiB;
`rank-<r>.state.pt` (torch.save, loadable with weights_only=True) holds the tree's skeleton, each
tensor's shard/offset/dtype/shape and the small per-rank state. Used for single-process jobs and
for the local (ramdisk) tier, which only ever serves the same rank on the same node. It writes at
disk speed while other threads hash, and restores by reading straight into the existing parameters
(no intermediate copy)."""

from __future__ import annotations

import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .state import TENSOR_REF, fill_skeleton, iter_tensors, local_tensor, skeleton

FORMAT = "kubeckpt-plain/1"
CHUNK = 32 * 1024 * 1024
SHARD_BYTES = 128 * 1024 * 1024  # small enough to spread the hashing evenly over the threads
# SHA-256 runs at ~1.7 GB/s a core, slower than a ramdisk or a fast disk: shards are hashed on
# several threads (hashlib releases the GIL), up to half the cores.
HASH_THREADS = min(8, max(2, (os.cpu_count() or 2) // 2))


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
    sha256: str


class _Shard:
    def __init__(self, directory: Path, rank: int, number: int) -> None:
        self.name = tensors_file(rank, number)
        self.fd = os.open(directory / self.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.digest = hashlib.sha256()
        self.size = 0
        self.hasher = 0


def write_rank(
    directory: Path, rank: int, tensor_tree: Any, small_state: dict[str, Any]
) -> list[WrittenFile]:
    """Write and fsync this rank's files; hash while writing. ENOSPC and friends propagate.

    Tensor bytes go to shards of about SHARD_BYTES, hashed on HASH_THREADS threads while the
    writing goes on; each shard's hash stays on one thread, which keeps its updates in order.
    """
    skel, tensors = skeleton(tensor_tree)
    index = []
    shards: list[_Shard] = []
    pending = []
    load = [0] * HASH_THREADS
    hashers = [
        ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kubeckpt-hash{i}")
        for i in range(HASH_THREADS)
    ]
    try:
        for t in map(local_tensor, tensors):  # a DTensor: this rank's shard, as staged
            if not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError("plain format needs contiguous CPU tensors (stage first)")
            view = _bytes_view(t)
            if not shards or (shards[-1].size and shards[-1].size + len(view) > SHARD_BYTES):
                shards.append(_Shard(directory, rank, len(shards)))
                # A new shard goes to the hash thread with the fewest bytes queued so far.
                shards[-1].hasher = min(range(len(hashers)), key=load.__getitem__)
            shard = shards[-1]
            hasher = hashers[shard.hasher]
            load[shard.hasher] += len(view)
            index.append(
                {
                    "file": len(shards) - 1,
                    "offset": shard.size,
                    "nbytes": len(view),
                    "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape),
                }
            )
            for start in range(0, len(view), CHUNK):
                chunk = view[start : start + CHUNK]
                pending.append(hasher.submit(shard.digest.update, chunk))
                while chunk:
                    chunk = chunk[os.write(shard.fd, chunk) :]
            shard.size += len(view)
        # fsync last: the kernel writes earlier shards back while later ones are still written.
        for shard in shards:
            os.fsync(shard.fd)
    finally:
        for shard in shards:
            os.close(shard.fd)
        for hasher in hashers:
            hasher.shutdown(wait=True)
    for f in pending:
        f.result()
    files = [WrittenFile(s.name, s.size, s.digest.hexdigest()) for s in shards]
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "skeleton": skel, "index": index, "state": small_state}, buf)
    data = buf.getvalue()
    fd = os.open(directory / state_file(rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    files.append(WrittenFile(state_file(rank), len(data), hashlib.sha256(data).hexdigest()))
    return files


def read_state(directory: Path, rank: int) -> dict[str, Any]:
    with open(directory / state_file(rank), "rb") as f:
        data = torch.load(f, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{state_file(rank)}: not a {FORMAT} state file")
    return data


def read_rank(directory: Path, rank: int, targets: Any, meta: dict[str, Any]) -> Any:
    """The saved tensor tree, read into `targets`' tensors where they match (same path, dtype,
    shape, contiguous CPU; a DTensor's local shard), into new tensors otherwise, then copied
    onto device targets."""
    target_by_path = dict(iter_tensors(targets))
    paths = _ref_paths(meta["skeleton"])
    index = meta["index"]
    loaded: list[torch.Tensor] = []
    files: dict[int, Any] = {}
    try:
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
            name = tensors_file(rank, entry["file"])
            if len(view) != entry["nbytes"]:
                raise ValueError(f"{name}: tensor {i} has the wrong size")
            f = files.get(entry["file"])
            if f is None:
                f = files[entry["file"]] = open(directory / name, "rb", buffering=0)
            f.seek(entry["offset"])
            while view:
                n = f.readinto(view)
                if not n:
                    raise ValueError(f"{name}: truncated")
                view = view[n:]
            if target is not None and not direct:
                if target.shape != dest.shape:
                    raise ValueError(
                        f"shape mismatch at {paths[i]}: checkpoint {tuple(dest.shape)}, "
                        f"model {tuple(target.shape)}"
                    )
                target.copy_(dest)
            # In place: the tree keeps the live (possibly distributed) tensor.
            loaded.append(dest if original is None else original)
    finally:
        for f in files.values():
            f.close()
    return fill_skeleton(meta["skeleton"], loaded)


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
