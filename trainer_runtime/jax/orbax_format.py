"""The persistent tier's format: one orbax checkpoint (`state/`), written by every process together.

orbax writes each shard of a global array once (from the process holding its first replica),
numpy leaves from process 0, and commits on its own terms: a temporary directory renamed into
place (or `commit_success.txt` where rename is not atomic). Restore checks that marker before
anything else, so an orbax save interrupted inside a kubeckpt checkpoint is never read even if
our manifest were somehow there. kubeckpt's manifest lists every file orbax wrote, with XXH3, so
a flipped byte is found before orbax reads it; process 0 hashes them once orbax has finished.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import format_checksum, hash_file, preferred_checksum
from ..fsutil import fsync_dir, fsync_file
from .local_format import WrittenFile

ITEM = "state"
INDEX = "jax.json"  # the leaves' paths, to refuse a checkpoint of another structure clearly
FORMAT = "kubeckpt-jax-orbax/1"


@functools.cache
def _checkpointer() -> Any:
    import orbax.checkpoint as ocp

    # Synchronous: it runs on kubeckpt's writer thread, which is what makes the save async.
    # Built once per process: a new one per save paid orbax's set-up every time.
    return ocp.Checkpointer(ocp.StandardCheckpointHandler())


def _flat(leaves: list[Any]) -> dict[str, Any]:
    # Python scalars as 0-d arrays: StandardCheckpointHandler takes arrays only.
    return {
        f"{i:06d}": leaf if hasattr(leaf, "shape") else np.asarray(leaf)
        for i, leaf in enumerate(leaves)
    }


def write(directory: Path, rank: int, paths: list[str], leaves: list[Any]) -> list[WrittenFile]:
    """Every process calls it (orbax's save is collective). Process 0 reports orbax's files and
    the index; the others report none."""
    _checkpointer().save(directory / ITEM, _flat(leaves))
    # orbax leaves its own metadata files (_METADATA, _CHECKPOINT_METADATA, array_metadatas/*,
    # commit_success.txt) and its final rename unsynced (strace, orbax-checkpoint 0.12.8):
    # every process makes what it sees durable before the manifest can claim it is.
    _fsync_tree(directory / ITEM)
    fsync_dir(directory)
    if rank != 0:
        return []
    index = directory / INDEX
    index.write_text(json.dumps({"format": FORMAT, "paths": paths}))
    with open(index, "rb+") as f:
        os.fsync(f.fileno())
    algorithm = preferred_checksum()
    out = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel.startswith(ITEM + "/") or rel == INDEX:
            size, digest = hash_file(path, algorithm)
            out.append(WrittenFile(rel, size, format_checksum(algorithm, digest)))
    return out


def _fsync_tree(root: Path) -> None:
    for here, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(Path(here, name))
        fsync_dir(here)


def check(directory: Path, paths: list[str]) -> None:
    """Raise unless orbax committed `state/` and it holds this structure."""
    import orbax.checkpoint as ocp

    item = directory / ITEM
    if not item.is_dir() or not ocp.utils.is_checkpoint_finalized(item):
        raise ValueError(f"{item}: not a finalized orbax checkpoint")
    saved = json.loads((directory / INDEX).read_text())
    if saved.get("format") != FORMAT:
        raise ValueError(f"{directory / INDEX}: not a {FORMAT} index")
    if saved.get("paths") != paths:
        raise ValueError("the checkpoint's state has another structure than the one to restore")


def read(directory: Path, targets: list[Any]) -> list[Any]:
    """Every process calls it: each array restored on its target's sharding."""
    import jax

    abstract = {}
    for key, target in _flat(targets).items():
        if isinstance(target, jax.Array | jax.ShapeDtypeStruct):
            abstract[key] = jax.ShapeDtypeStruct(
                target.shape, target.dtype, sharding=target.sharding
            )
        else:
            abstract[key] = np.asarray(target)
    restored = _checkpointer().restore(directory / ITEM, abstract)
    out = []
    for key, target in zip(sorted(abstract), targets, strict=True):
        value = restored[key]
        if not hasattr(target, "shape") and not isinstance(target, np.ndarray):
            value = np.asarray(value).item()  # a Python scalar comes back as one
        out.append(value)
    return out
