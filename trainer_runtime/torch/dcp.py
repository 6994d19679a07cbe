"""torch.distributed.checkpoint for multi-rank persistent checkpoints.

Each rank writes its own shard files (`__<rank>_<n>.distcp`, fsynced by DCP), the coordinator
writes `.metadata` once all ranks' writes succeeded; DCP reshards on load, so a job can resume with
another world size. These calls run on the manager's I/O process group.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp

from .plain import WrittenFile

METADATA = ".metadata"


def save(directory: Path, tree: dict[str, Any], group: Any) -> None:
    writer = dcp.FileSystemWriter(str(directory), sync_files=True, thread_count=1)
    # DCP keeps one copy of a tensor every rank holds under the same key. Model buffers such as
    # BatchNorm statistics differ between DDP ranks until DDP re-broadcasts rank 0's at the next
    # forward, so rank 0's copy is the one that must be kept.
    planner = dcp.DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    dcp.save(
        tree, storage_writer=writer, planner=planner, process_group=group, no_dist=group is None
    )


def load(directory: Path, targets: dict[str, Any], group: Any) -> None:
    """Load in place into `targets` (the state dict from get_state_dict)."""
    reader = dcp.FileSystemReader(str(directory))
    dcp.load(targets, storage_reader=reader, process_group=group, no_dist=group is None)


def owned_files(directory: Path, rank: int, claimed_by_others: set[str]) -> list[str]:
    """The files of a DCP checkpoint this rank accounts for in the manifest: its shard files
    (DCP's `__<rank>_` prefix); rank 0 also takes `.metadata` and anything nobody else claims."""
    prefix = f"__{rank}_"
    names = sorted(os.listdir(directory))
    mine = [n for n in names if n.startswith(prefix) and n.endswith(".distcp")]
    if rank == 0:
        mine += [
            n
            for n in names
            if n not in mine
            and n not in claimed_by_others
            and not n.startswith("__")
            and (directory / n).is_file()
        ]
    return mine


def is_dcp_shard(name: str) -> bool:
    return name.startswith("__") and name.endswith(".distcp")


def hash_files(directory: Path, names: list[str]) -> list[WrittenFile]:
    out = []
    for name in names:
        digest = hashlib.sha256()
        size = 0
        with open(directory / name, "rb", buffering=0) as f:
            while chunk := f.read(8 * 1024 * 1024):
                digest.update(chunk)
                size += len(chunk)
        out.append(WrittenFile(name, size, digest.hexdigest()))
    return out
