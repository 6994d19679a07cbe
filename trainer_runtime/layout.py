"""The checkpoint protocol on a local or mounted filesystem (stdlib only).

`<root>/checkpoint-<step>/` (or `<root>/generation-<N>/checkpoint-<step>/`, generations.py) is
written in this order, each step durable before the next:

1. the directory, holding only the sentinel `checkpoint-is-incomplete.txt` (fsynced with both
   directories), so even an empty leftover is recognisably incomplete; the writer touches it
   every second until step 4 (heartbeat.py; handover.py: a replacement pod waits for a live
   writer);
2. the data files, each fsynced by its writer;
3. `manifest.json` (size and checksum of every file), written atomically: temp, fsync, rename,
   fsync the directory;
4. the sentinel removed, and the directory fsynced.

A checkpoint is complete only when the manifest exists and the sentinel is gone (DESIGN.md). A crash
before 3 leaves no manifest; a crash between 3 and 4 leaves the sentinel: both read as incomplete,
and resume deletes them. A complete one has every byte the manifest describes on disk, and resume
checks sizes and checksums before trusting it. Deletion (retention, cleanup) first renames the
directory to a hidden trash name, so a crash half-way never leaves a "complete" one with files
missing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import heartbeat
from .contract import (
    INCOMPLETE_SENTINEL,
    Manifest,
    UnsupportedFormatVersion,
    checkpoint_dir_name,
    generation_dir_name,
    is_complete,
    parse_checkpoint_dir_name,
    parse_generation_dir_name,
    read_manifest,
    read_sequence,
    verify,
    write_manifest_atomic,
)
from .fsutil import fsync_dir, remove_tree, sweep_trash, write_durable
from .generations import Entry, expired

log = logging.getLogger(__name__)

__all__ = [
    "Entry",
    "begin",
    "checkpoint_path",
    "finalize",
    "generation_dir",
    "generation_dirs",
    "remove_incomplete",
    "retain",
    "scan",
    "scan_dir",
    "verify_checkpoint",
    "with_sequences",
]


def generation_dir(root: str | os.PathLike[str], generation: int) -> Path:
    """Where generation `generation` of `root` keeps its checkpoints (0: `root` itself)."""
    root = Path(root)
    return root if generation == 0 else root / generation_dir_name(generation)


def checkpoint_path(root: str | os.PathLike[str], step: int, generation: int = 0) -> Path:
    return generation_dir(root, generation) / checkpoint_dir_name(step)


def generation_dirs(root: str | os.PathLike[str]) -> dict[int, Path]:
    """Every generation under `root`, 0 (`root` itself) included when it exists; symlinks are
    not generations (nor checkpoints), so nothing is reached outside `root`."""
    root = Path(root)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return {}
    found = {0: root}
    for entry in entries:
        n = parse_generation_dir_name(entry.name)
        if n is not None and entry.is_dir(follow_symlinks=False):
            found[n] = Path(entry.path)
    return found


def scan_dir(directory: str | os.PathLike[str], generation: int = 0) -> list[Entry]:
    """The checkpoint directories directly in `directory` (one generation), oldest step first."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        step = parse_checkpoint_dir_name(entry.name)
        if step is None or not entry.is_dir(follow_symlinks=False):
            continue
        found.append(Entry(step=step, complete=is_complete(entry.path), generation=generation))
    found.sort(key=lambda e: e.step)
    return found


def scan(root: str | os.PathLike[str]) -> list[Entry]:
    """Every checkpoint directory under `root`, in every generation: by generation, then step."""
    found: list[Entry] = []
    for generation, directory in sorted(generation_dirs(root).items()):
        found += scan_dir(directory, generation)
    return found


def with_sequences(root: str | os.PathLike[str], entries: list[Entry]) -> list[Entry]:
    """`entries` with the sequence of each complete one read from its manifest (None for one
    without, or an invalid one: it orders oldest); OSError when a manifest cannot be read, since
    nothing is known of it then."""
    return [
        dataclasses.replace(e, sequence=read_sequence(checkpoint_path(root, e.step, e.generation)))
        if e.complete
        else e
        for e in entries
    ]


def begin(root: str | os.PathLike[str], step: int) -> Path:
    """Create `checkpoint-<step>/` holding only the sentinel (a stale one is replaced)."""
    root = Path(root)
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        fsync_dir(root.parent)  # a new generation's directory survives a crash too
    path = root / checkpoint_dir_name(step)
    if path.exists():
        # Left by a crash, or a save at this step that failed: never write into old files.
        remove_tree(path)
    path.mkdir()
    sentinel = path / INCOMPLETE_SENTINEL
    write_durable(sentinel, heartbeat.owner_record().encode())
    fsync_dir(path)
    fsync_dir(root)
    # A replacement pod's restore waits while this beats (handover.py); it stops by itself once
    # the sentinel is gone.
    heartbeat.start(sentinel)
    return path


def finalize(path: str | os.PathLike[str], manifest: Manifest) -> None:
    """Steps 3 and 4: the manifest, then the sentinel goes. Data must already be fsynced."""
    path = Path(path)
    write_manifest_atomic(path, manifest)
    (path / INCOMPLETE_SENTINEL).unlink(missing_ok=True)
    fsync_dir(path)


def remove_incomplete(root: str | os.PathLike[str]) -> list[int]:
    """Delete incomplete checkpoints (and interrupted deletions) in every generation under
    `root`; the steps removed. Only what never completed goes: a complete checkpoint of any
    generation is left alone."""
    removed = []
    for generation, directory in sorted(generation_dirs(root).items()):
        sweep_trash(directory)
        for entry in scan_dir(directory, generation):
            if not entry.complete:
                remove_tree(directory / checkpoint_dir_name(entry.step))
                removed.append(entry.step)
    if removed:
        log.info("kubeckpt: removed incomplete checkpoints %s in %s", removed, root)
    return removed


def retain(
    root: str | os.PathLike[str], keep: int, generation: int = 0, spare: Collection[int] = ()
) -> list[int]:
    """Keep the `keep` newest complete checkpoints of `generation` by commit order (at least the
    newest), and those of the steps in `spare`; the steps deleted. Other generations are never
    touched.

    Incomplete directories are left alone here: one may be a save still in progress. A manifest
    that cannot be read (OSError) stops retention this time: its place in commit order is
    unknown, and the next commit tries again.
    """
    directory = generation_dir(root, generation)
    entries = with_sequences(root, scan_dir(directory, generation))
    doomed = [e.step for e in expired(entries, generation, keep) if e.step not in spare]
    for step in doomed:
        remove_tree(directory / checkpoint_dir_name(step))
    return doomed


def verify_checkpoint(
    path: str | os.PathLike[str],
    *,
    checksums: bool | Callable[[int], bool],
    threads: int | None = None,
    deferred: Callable[[Manifest], Collection[str]] | None = None,
) -> tuple[Manifest | None, list[str]]:
    """Read and check a checkpoint's manifest against its files: sizes always, content checksums
    (each file's xxh3_128 or sha256) when `checksums` is True or, given a callable, when it
    returns True for the total size. The files `deferred` names (given the manifest) get only
    the size check here: their reader checks the content as it loads them (resume's one pass).

    Returns (manifest, problems); the manifest is None when it cannot be read. A manifest of a
    format version this runtime does not know raises UnsupportedFormatVersion instead. Files are
    hashed on `threads` threads (default: the cores, 2 to 8; hashing releases the GIL), the
    largest first, each to the least loaded thread.
    """
    path = Path(path)
    if not is_complete(path):
        return None, [f"{path}: incomplete (no manifest, or the sentinel is still there)"]
    try:
        manifest = read_manifest(path)
    except UnsupportedFormatVersion:
        raise  # not a bad checkpoint: a newer runtime's, which this one must not judge
    except (OSError, ValueError) as e:
        return None, [f"{path}: unreadable manifest: {e}"]
    problems = verify(path, manifest, checksums=False)  # sizes first: cheap, and catches most
    if callable(checksums):
        checksums = checksums(manifest.total_size)
    skip = frozenset(deferred(manifest)) if deferred is not None else frozenset()
    hashed = [f for f in manifest.files if f.path not in skip]
    if problems or not checksums or not hashed:
        return manifest, problems
    if threads is None:
        threads = min(8, max(2, os.cpu_count() or 2))
    groups: list[list] = [[] for _ in range(min(threads, len(hashed)))]
    loads = [0] * len(groups)
    for entry in sorted(hashed, key=lambda f: -f.size):
        i = loads.index(min(loads))
        groups[i].append(entry)
        loads[i] += entry.size
    parts = [
        Manifest(
            step=manifest.step,
            epoch=manifest.epoch,
            time=manifest.time,
            world_size=manifest.world_size,
            framework=manifest.framework,
            tier=manifest.tier,
            files=group,
        )
        for group in groups
    ]
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        for result in pool.map(lambda m: verify(path, m, checksums=True), parts):
            problems.extend(result)
    return manifest, problems
