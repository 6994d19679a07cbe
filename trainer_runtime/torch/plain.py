"""The per-rank checkpoint format: one raw tensor file and one small state file per rank.

`rank-<r>.tensors` is every tensor's bytes back to back; `rank-<r>.state.pt` (torch.save, loadable
with weights_only=True) holds the tree's skeleton, each tensor's offset/dtype/shape and the small
per-rank state. Used for single-process jobs and for the local (ramdisk) tier, which only ever
serves the same rank on the same node. It writes at disk speed while hashing on a second thread,
and restores by reading straight into the existing parameters (no intermediate copy).
"""

from __future__ import annotations

import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .state import TENSOR_REF, fill_skeleton, iter_tensors, skeleton

FORMAT = "kubeckpt-plain/1"
CHUNK = 32 * 1024 * 1024


def tensors_file(rank: int) -> str:
    return f"rank-{rank}.tensors"


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


def write_rank(
    directory: Path, rank: int, tensor_tree: Any, small_state: dict[str, Any]
) -> list[WrittenFile]:
    """Write and fsync this rank's two files; hash while writing. ENOSPC and friends propagate."""
    skel, tensors = skeleton(tensor_tree)
    index = []
    digest = hashlib.sha256()
    offset = 0
    fd = os.open(directory / tensors_file(rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # hashlib releases the GIL on large buffers, so the hash of chunk i runs on the second core
    # while chunk i+1 is written; the single worker keeps the updates in order.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubeckpt-hash") as hasher:
        pending = []
        try:
            for t in tensors:
                if not t.is_contiguous() or t.device.type != "cpu":
                    raise ValueError("plain format needs contiguous CPU tensors (stage first)")
                view = _bytes_view(t)
                index.append(
                    {
                        "offset": offset,
                        "nbytes": len(view),
                        "dtype": str(t.dtype).removeprefix("torch."),
                        "shape": list(t.shape),
                    }
                )
                for start in range(0, len(view), CHUNK):
                    chunk = view[start : start + CHUNK]
                    pending.append(hasher.submit(digest.update, chunk))
                    while chunk:
                        n = os.write(fd, chunk)
                        chunk = chunk[n:]
                offset += len(view)
            os.fsync(fd)
        finally:
            os.close(fd)
            for f in pending:
                f.result()
    files = [WrittenFile(tensors_file(rank), offset, digest.hexdigest())]
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
    shape, contiguous CPU), into new tensors otherwise; then copied onto device targets."""
    target_by_path = dict(iter_tensors(targets))
    paths = _ref_paths(meta["skeleton"])
    index = meta["index"]
    loaded: list[torch.Tensor] = []
    with open(directory / tensors_file(rank), "rb", buffering=0) as f:
        for i, entry in enumerate(index):
            dtype = getattr(torch, entry["dtype"])
            shape = tuple(entry["shape"])
            target = target_by_path.get(paths[i])
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
                raise ValueError(f"{tensors_file(rank)}: tensor {i} has the wrong size")
            f.seek(entry["offset"])
            while view:
                n = f.readinto(view)
                if not n:
                    raise ValueError(f"{tensors_file(rank)}: truncated")
                view = view[n:]
            if target is not None and not direct:
                if target.shape != dest.shape:
                    raise ValueError(
                        f"shape mismatch at {paths[i]}: checkpoint {tuple(dest.shape)}, "
                        f"model {tuple(target.shape)}"
                    )
                target.copy_(dest)
                dest = target
            loaded.append(dest)
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
