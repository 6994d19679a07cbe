"""Small durable-file helpers shared by the runtime core (stdlib only)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

TRASH_PREFIX = ".kubeckpt-trash-"


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a directory's entries (creations, renames, unlinks) durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Readers see the old file or the whole new one: temp file beside it, fsync, rename, fsync dir.

    The temp file lives in the target's directory so the rename never crosses filesystems.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)


def write_durable(path: str | os.PathLike[str], data: bytes | memoryview) -> None:
    """Create (or truncate) `path`, write all of `data`, fsync. Errors (ENOSPC) propagate."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Delete a directory so that a crash half-way never leaves a partly deleted one in place.

    Renamed to a hidden trash name first (atomic, and discovery ignores it), then removed;
    `sweep_trash` finishes what a crash interrupted.
    """
    p = Path(path)
    if not p.exists():
        return
    trash = p.with_name(f"{TRASH_PREFIX}{p.name}-{uuid.uuid4().hex[:8]}")
    os.rename(p, trash)
    fsync_dir(p.parent)
    shutil.rmtree(trash, ignore_errors=True)


def sweep_trash(root: str | os.PathLike[str]) -> None:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith(TRASH_PREFIX):
            shutil.rmtree(entry.path, ignore_errors=True)
