"""The persistent tier's format: one orbax checkpoint (`state/`), written by every process together.

The save is orbax's own async path: `start` on the training thread does orbax's blocking part only
(every shard's transfer to host memory, after which a step may donate the state's buffers), and
orbax writes and commits in its own thread into a staging directory beside the checkpoints
(`<tier>/.kubeckpt-orbax/<step>`), because the commit protocol's `begin` recreates
`checkpoint-<step>/` after the state is staged. `finish`, on kubeckpt's writer thread, waits for
orbax, makes every file durable (orbax does not fsync), and once every process agrees moves the
committed checkpoint into `checkpoint-<step>/state` (process 0; one rename on the same filesystem)
and describes it for the manifest. A staging directory left by a crash or a save that was never
committed is removed by a later save's `finish`, or replaced by orbax when the same step is saved
again.

orbax writes each shard of a global array once (from the process holding its first replica),
numpy leaves from process 0, and commits on its own terms: a temporary directory renamed into
place (or `commit_success.txt` where rename is not atomic). Restore checks that marker before
anything else, so an orbax save interrupted inside a kubeckpt checkpoint is never read even if
our manifest were somehow there. kubeckpt's manifest lists every file orbax wrote, with XXH3, so
a flipped byte is found before orbax reads it; process 0 hashes them once orbax has finished.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract import format_checksum, hash_file, preferred_checksum
from ..fsutil import fsync_dir, fsync_file
from ..protocol.agreement import timeout_seconds
from .local_format import WrittenFile

log = logging.getLogger("trainer_runtime.jax")

ITEM = "state"
STAGING = ".kubeckpt-orbax"  # in the tier's generation directory; not a checkpoint name
INDEX = "jax.json"  # the leaves' paths, to refuse a checkpoint of another structure clearly
FORMAT = "kubeckpt-jax-orbax/1"


@functools.cache
def _checkpointer() -> Any:
    """For restores. Built once per process: a new one per call paid orbax's set-up each time."""
    import orbax.checkpoint as ocp

    return ocp.Checkpointer(ocp.StandardCheckpointHandler())


@functools.cache
def _async_checkpointer() -> Any:
    """For saves: one per process, so a save waits for the previous one inside orbax too. Its
    barriers wait for a silent process as long as our own collectives do (orbax's default is 20
    minutes): a save that failed on one process fails on the others at the same time."""
    import orbax.checkpoint as ocp

    # timeout_seconds() is at least 1: orbax refuses a timeout of 0.
    timeout = int(timeout_seconds())
    return ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler(), timeout_secs=timeout)


def _flat(leaves: list[Any]) -> dict[str, Any]:
    # Python scalars as 0-d arrays: StandardCheckpointHandler takes arrays only.
    return {
        f"{i:06d}": leaf if hasattr(leaf, "shape") else np.asarray(leaf)
        for i, leaf in enumerate(leaves)
    }


def staging_dir(tier_directory: Path, step: int) -> Path:
    return tier_directory / STAGING / str(step)


@dataclass
class Pending:
    """orbax's async save of one step, started on the training thread."""

    path: Path
    error: str | None = None
    waited: bool = False

    def wait(self) -> None:
        """Until orbax has written and committed (every process: orbax's last barrier waits for
        process 0's commit); orbax's own error, if any, is raised here."""
        if self.waited:
            return
        self.waited = True
        _async_checkpointer().wait_until_finished()


def start(path: Path, leaves: list[Any]) -> Pending:
    """Every process, on the training thread, at the same step (orbax's save is collective).
    Returns once every shard is in host memory. A failure is kept for `finish` to report (the
    training step is never the one to fail)."""
    import orbax.checkpoint as ocp

    pending = Pending(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # force: a staging directory of the same step left by a crashed run is replaced.
        _async_checkpointer().save(path, args=ocp.args.StandardSave(_flat(leaves)), force=True)
    except Exception as e:
        pending.error = f"orbax: {type(e).__name__}: {e}"
        pending.waited = True
    return pending


def finish(
    pending: Pending,
    directory: Path,
    rank: int,
    paths: list[str],
    all_ok: Callable[[bool], bool],
) -> list[WrittenFile]:
    """Every process, on the writer thread (collective: `all_ok` is the save's agreement).
    Process 0 moves orbax's checkpoint into `directory` and reports its files and the index;
    the others report none."""
    error = pending.error
    if error is None:
        try:
            pending.wait()
            # orbax leaves its own metadata files (_METADATA, _CHECKPOINT_METADATA,
            # array_metadatas/*, commit_success.txt) and its final rename unsynced (strace,
            # orbax-checkpoint 0.12.8): every process makes what it wrote durable before the
            # manifest can claim it is.
            _fsync_tree(pending.path)
            fsync_dir(pending.path.parent)
        except Exception as e:
            error = f"orbax: {type(e).__name__}: {e}"
    if not all_ok(error is None):
        raise RuntimeError(error or "orbax's save failed on another process")
    if rank != 0:
        return []
    os.replace(pending.path, directory / ITEM)
    fsync_dir(directory)
    fsync_dir(pending.path.parent)
    _remove_stale(pending.path.parent, up_to=int(pending.path.name))
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


def _remove_stale(staging: Path, *, up_to: int) -> None:
    """Staging directories (orbax's temporary ones too) of steps up to `up_to`: left by a crash
    or by a save that was not committed. Later steps may be a save in flight."""
    for entry in list(staging.iterdir()):
        head = entry.name.split(".", 1)[0]
        if head.isdigit() and int(head) <= up_to:
            log.info("kubeckpt: removing orbax's leftover staging directory %s", entry)
            shutil.rmtree(entry, ignore_errors=True)
            with contextlib.suppress(OSError):
                entry.unlink()


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
