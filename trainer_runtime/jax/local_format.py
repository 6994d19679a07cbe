"""The local (ramdisk) tier's format: each process's own data, one raw file and one index.

orbax writes one logical checkpoint across all processes: numpy leaves only from process 0, and it
refuses host-local arrays in a multi-process job (orbax-checkpoint 0.12). A per-node ramdisk needs
the opposite, each process's own copy of what it holds, readable without the others. So this
tier keeps, per process, `process-<k>.bin` (every addressable shard's bytes back to back, hashed
while written) and `process-<k>.json` (each leaf's path, dtype, shape and shard indices); restore
rebuilds each array on the target's sharding from the shards this process needs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import format_checksum, new_hasher, preferred_checksum
from ..fsutil import WRITE_PIECE as CHUNK
from ..fsutil import lower_thread_priority, write_all, write_durable
from .shards import shard_index

FORMAT = "kubeckpt-jax-local/1"


@dataclass(frozen=True)
class WrittenFile:
    path: str  # relative to the checkpoint directory
    size: int
    checksum: str  # contract.format_checksum: "<algorithm>:<hex>" for XXH3


def data_file(rank: int) -> str:
    return f"process-{rank}.bin"


def index_file(rank: int) -> str:
    return f"process-{rank}.json"


def host_parts(leaf: Any) -> tuple[dict[str, Any], list[np.ndarray]]:
    """(description, arrays) of what this process holds of `leaf`: a jax.Array's addressable
    shards (one per distinct index), or the whole value of anything else; a snapshot's
    `HostLeaf` as it was taken."""
    import jax

    from .snapshot import HostLeaf

    if isinstance(leaf, HostLeaf):
        leaf.gather()
        return dict(leaf.desc), list(leaf.parts)
    if isinstance(leaf, jax.Array):
        seen: dict[str, np.ndarray] = {}
        indices = []
        for shard in leaf.addressable_shards:
            idx = shard_index(shard.index, leaf.shape)
            key = json.dumps(idx)
            if key not in seen:
                seen[key] = np.asarray(shard.data)
                indices.append(idx)
        desc = {"kind": "array", "shape": list(leaf.shape), "dtype": str(leaf.dtype)}
        desc["shards"] = indices
        return desc, list(seen.values())
    value = np.asarray(leaf)
    kind = "scalar" if np.ndim(leaf) == 0 and not isinstance(leaf, np.ndarray) else "numpy"
    desc = {"kind": kind, "shape": list(value.shape), "dtype": str(value.dtype)}
    desc["shards"] = [[[0, n] for n in value.shape]]
    return desc, [value]


def write_process(
    directory: Path, rank: int, paths: list[str], leaves: list[Any]
) -> list[WrittenFile]:
    """Write and fsync this process's two files; hash while writing."""
    lower_thread_priority()  # a background save yields the CPU to training (fsutil.WRITER_NICE)
    algorithm = preferred_checksum()
    digest = new_hasher(algorithm)
    entries = []
    offset = 0
    fd = os.open(directory / data_file(rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for path, leaf in zip(paths, leaves, strict=True):
            desc, arrays = host_parts(leaf)
            desc["path"] = path
            desc["parts"] = []
            for arr in arrays:
                view = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
                for start in range(0, len(view), CHUNK):
                    chunk = view[start : start + CHUNK]
                    digest.update(chunk)
                    write_all(fd, chunk, offset + start)
                desc["parts"].append({"offset": offset, "nbytes": len(view)})
                offset += len(view)
            entries.append(desc)
        os.fsync(fd)
    finally:
        os.close(fd)
    index = json.dumps({"format": FORMAT, "leaves": entries}).encode()
    index_digest = new_hasher(algorithm)
    index_digest.update(index)
    write_durable(directory / index_file(rank), index)
    return [
        WrittenFile(data_file(rank), offset, format_checksum(algorithm, digest.hexdigest())),
        WrittenFile(
            index_file(rank), len(index), format_checksum(algorithm, index_digest.hexdigest())
        ),
    ]


def read_index(directory: Path, rank: int) -> list[dict[str, Any]]:
    data = json.loads((directory / index_file(rank)).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{index_file(rank)}: not a {FORMAT} index")
    return data["leaves"]


def read_process(
    directory: Path, rank: int, leaves: list[dict[str, Any]], targets: list[Any]
) -> list[Any]:
    """Every leaf rebuilt like its target: a jax.Array on the target's sharding from the shards
    this process needs, a numpy array, or a Python scalar."""
    import jax
    import jax.numpy as jnp

    out = []
    with open(directory / data_file(rank), "rb", buffering=0) as f:
        for desc, target in zip(leaves, targets, strict=True):
            dtype = jnp.dtype(desc["dtype"])
            shape = tuple(desc["shape"])
            parts = {}
            for idx, part in zip(desc["shards"], desc["parts"], strict=True):
                shard_shape = tuple(b - a for a, b in idx)
                arr = np.empty(shard_shape, dtype=dtype)
                view = memoryview(arr.reshape(-1).view(np.uint8))
                if len(view) != part["nbytes"]:
                    raise ValueError(f"{desc['path']}: a shard has the wrong size")
                f.seek(part["offset"])
                while view:
                    n = f.readinto(view)
                    if not n:
                        raise ValueError(f"{data_file(rank)}: truncated")
                    view = view[n:]
                parts[json.dumps(idx)] = arr
            if isinstance(target, jax.Array | jax.ShapeDtypeStruct):
                if tuple(target.shape) != shape:
                    raise ValueError(
                        f"{desc['path']}: checkpoint shape {shape}, target {tuple(target.shape)}"
                    )
                sharding = target.sharding
                singles = []
                for device, index in sharding.addressable_devices_indices_map(shape).items():
                    key = json.dumps(shard_index(index, shape))
                    if key not in parts:
                        raise ValueError(
                            f"{desc['path']}: no saved shard for {key} (another sharding?)"
                        )
                    singles.append(jax.device_put(parts[key], device))
                out.append(jax.make_array_from_single_device_arrays(shape, sharding, singles))
            else:
                value = next(iter(parts.values()))
                out.append(value.item() if desc["kind"] == "scalar" else value)
    return out
