"""Writing a large file around the page cache (O_DIRECT), hashing it on the way.

Why: a buffered write copies every byte into the page cache, and the kernel then keeps, writes
back and later evicts those pages. For a checkpoint of 1.1 GiB that cost 0.84-1.29 CPU-s here,
against 0.17 CPU-s for O_DIRECT writes of 8 MiB straight from page-aligned memory, which the
device reads itself (and 0.7-0.9 s of wall time against 0.9-1.3 s). On a node whose training
keeps every core busy, that CPU is training time. A save also no longer pushes the node's own
cached data (a dataset) out of the page cache.

O_DIRECT needs the memory address, the file offset and the length aligned to the device's
logical block; ALIGN (4096) covers the common ones. The staging buffers are allocated aligned and
the plain format starts each large tensor on an ALIGN boundary, so most bytes go straight from
the staged tensor to the device. What is not aligned (small tensors, memory the stager did not
allocate) is gathered in an aligned bounce buffer and written from there. The file's tail is
written padded to ALIGN and the file then truncated to its size.

A filesystem that refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE and network filesystems)
refuses at open or at the first write with EINVAL; the file is then written buffered, with the
writeback started after each piece (fsutil.write_all), as before.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from typing import Any, Final

from .fsutil import WRITE_PIECE, write_all

ALIGN: Final = 4096
# One direct write: larger pieces cost less CPU per byte (8 MiB: 0.17 CPU-s per 1.1 GiB,
# 1 MiB: 0.21-0.27 on the benchmark machine).
DIRECT_PIECE: Final = 8 * 1024 * 1024
BOUNCE_BYTES: Final = 4 * 1024 * 1024
_O_DIRECT: Final = getattr(os, "O_DIRECT", 0)
# Anonymous memory as malloc's: not shared with forked children (a DataLoader's workers), and
# not counted as shared memory (mmap's default for an anonymous map is MAP_SHARED).
PRIVATE: Final = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS


def address(view: memoryview) -> int | None:
    """Where a writable buffer's bytes start in memory; None for a read-only or empty one."""
    if view.readonly or not view.nbytes:
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def aligned(view: memoryview) -> bool:
    at = address(view)
    return at is not None and at % ALIGN == 0


class Bounce:
    """An ALIGN-aligned scratch buffer (an anonymous mapping starts on a page), reused for every
    file one writer writes."""

    def __init__(self, size: int = BOUNCE_BYTES) -> None:
        self._map = mmap.mmap(-1, size, flags=PRIVATE)
        self.view = memoryview(self._map)

    def close(self) -> None:
        """Unmap now; where a slice of it is still referenced (a failed write's traceback), the
        mapping goes with the last reference instead."""
        try:
            self.view.release()
            self._map.close()
        except BufferError:
            pass


class HashedFile:
    """One new file, written in order (`write_at` with rising offsets; gaps are zeros) and hashed
    as written: `digest` sees exactly the file's bytes. `finish()` writes what is left and fsyncs;
    `close()` always. Files that share a bounce buffer are written one after the other, each
    finished before the next is written to."""

    def __init__(self, path: os.PathLike[str] | str, digest: Any, bounce: Bounce | None) -> None:
        """`bounce` None: written buffered (a caller whose digest reads the bytes later, on
        another thread, cannot have them copied through a buffer that is reused)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self.fd = -1
        self.direct = False
        if bounce is not None and _O_DIRECT:
            try:
                self.fd = os.open(path, flags | _O_DIRECT, 0o644)
                self.direct = True
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        if self.fd < 0:
            self.fd = os.open(path, flags, 0o644)
        self.digest = digest
        self.size = 0  # bytes given so far, gaps included: the file's size when finished
        self._bounce = bounce
        self._fill = 0  # bytes in the bounce buffer, which land at size - _fill

    def write_at(self, offset: int, view: memoryview) -> None:
        if offset < self.size:
            raise ValueError(f"write at {offset}, before the end of what was written ({self.size})")
        if offset > self.size:
            self._put(memoryview(bytes(offset - self.size)))  # the layout's alignment gap
        self._put(view)

    def finish(self, *, fsync: bool = True) -> None:
        """Write the rest (the tail padded to ALIGN, then cut back to the size), then fsync
        unless told not to (a caller syncing many files at the end). Nothing is written after."""
        if self._fill:
            fill, bounce = self._fill, self._bounce
            assert bounce is not None
            padded = -(-fill // ALIGN) * ALIGN
            bounce.view[fill:padded] = bytes(padded - fill)
            self.digest.update(bounce.view[:fill])
            self._write(bounce.view[:padded], self.size - fill)
            self._fill = 0
            if padded != fill:
                os.ftruncate(self.fd, self.size)
        if fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _put(self, view: memoryview) -> None:
        if not self.direct:
            self._flush()  # what was gathered before the filesystem refused a direct write
            for begin in range(0, len(view), WRITE_PIECE):
                piece = view[begin : begin + WRITE_PIECE]
                self.digest.update(piece)
                self._write(piece, self.size)
                self.size += len(piece)
            return
        bounce = self._bounce
        assert bounce is not None
        while view:
            if len(view) >= ALIGN and self._fill % ALIGN == 0 and aligned(view):
                self._flush()  # whole blocks, so the file offset is on the grid again
                n = min(len(view) // ALIGN * ALIGN, DIRECT_PIECE)
                self.digest.update(view[:n])
                self._write(view[:n], self.size)
                self.size += n
                view = view[n:]
                continue
            n = min(len(view), len(bounce.view) - self._fill)
            bounce.view[self._fill : self._fill + n] = view[:n]
            self._fill += n
            self.size += n
            view = view[n:]
            if self._fill == len(bounce.view):
                self._flush()

    def _flush(self) -> None:
        """Write the bounce buffer's bytes: whole blocks (the callers see to that) unless the
        file went buffered."""
        if not self._fill:
            return
        assert self._bounce is not None
        piece = self._bounce.view[: self._fill]
        self.digest.update(piece)
        self._write(piece, self.size - self._fill)
        self._fill = 0

    def _write(self, view: memoryview, offset: int) -> None:
        """Write all of `view` at `offset`: direct while the filesystem takes it, else (and for
        the rest, once it refused) buffered."""
        while view and self.direct:
            try:
                n = os.pwrite(self.fd, view, offset)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise  # ENOSPC and friends: the save fails, as a buffered one would
                self._buffered()
                break
            view, offset = view[n:], offset + n
            if n % ALIGN:  # a short write off the block grid: no more direct
                self._buffered()
        if view:
            write_all(self.fd, view, offset)

    def _buffered(self) -> None:
        """This filesystem refused a direct write: the rest of the file goes buffered (what
        the bounce buffer holds is written from there first)."""
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~_O_DIRECT)
        self.direct = False
