"""Small durable-file helpers shared by the runtime core (stdlib only)."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

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


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, no wait


@functools.cache
def _sync_file_range() -> Any:
    """libc's sync_file_range (Linux), or None. Python's os module does not expose it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing `nbytes` at `offset` to the device now, without waiting.

    A gigabyte written to the page cache stays below the dirty thresholds, so without this the
    disk only starts at fsync and a save costs copy time + disk time; with it the two overlap
    and the final fsync waits for the tail only. Best effort: a no-op where unsupported (tmpfs
    ignores it, other systems lack it).
    """
    fn = _sync_file_range()
    if fn is not None and nbytes > 0:
        fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


# The piece a buffered writer hashes and then writes, while it is still in the CPU cache (L2).
# Not more: on Linux 6.18 (ext4) buffered writes of 2 MiB or more cost 5-10x the kernel CPU of
# 1 MiB writes (0.65-1.5 s against 0.14 s per 600 MB).
WRITE_PIECE = 1024 * 1024


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """pwrite all of `data` at `offset`, then start_writeback on it. Positioned, so a file that
    also had direct writes (which never move the file's offset) is written in the right place."""
    view = memoryview(data)
    at = offset
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n
    start_writeback(fd, offset, len(data))


# The writer thread's nice value (Linux: per thread). A background save then yields part of the
# CPU to the training threads: the copy takes a little longer, training steps slow down less. A
# blocking save runs at the same speed (training is waiting, nothing contends). 5, not 10: beside
# a loop that keeps both cores busy, nice 10 (~10 % of a core) left the save durable after
# 2.0-3.9 s; nice 5 made it 1.56-1.59 s for the same training time lost (runtime_peers.py).
WRITER_NICE = 5
# Peer copies of the ramdisk tier (peer_copy/: the pusher, and the server's threads receiving a
# peer's copy) are best effort, the persistent tier being the fallback, so they yield more: with
# a local checkpoint every 5 steps of 50 ms (hack/bench/peer_copy.py, 2 cores, 256 MiB per rank)
# training lost 2.6-3.1x the local tier's time per checkpoint at nice 0, 1.6-1.8x at 5, 1.4x at
# 10 and 1.4x at 19 (where more copies were superseded before they were sent).
PEER_COPY_NICE = 10


def lower_thread_priority(nice: int | None = None) -> None:
    """Raise the calling thread's nice value to `nice` (default WRITER_NICE), never lower it
    (that needs privileges). Not on the main thread, whose priority is the training loop's.
    Best effort: a no-op where unsupported."""
    target = WRITER_NICE if nice is None else nice
    if threading.current_thread() is threading.main_thread() or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()  # Linux applies PRIO_PROCESS to one thread given its id
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError:
        pass
