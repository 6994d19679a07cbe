"""How much host memory a save may stage: a budget, and the plan that keeps a save within it.

An async save copies each rank's state to host memory so training can go on while it is written.
A full copy doubles the state's host footprint, and on a node sized for training that is how
staging runs a container into its memory limit (the OOM killer, or the kubelet's eviction, which
counts the working set: usage minus inactive page cache). The budget is what fits beside the
process's own use under that limit, minus a margin; a state larger than the budget is staged in
chunks of at most the budget through one reused buffer (torch/staging.py).

`budget()` and `plan_chunks()` are pure; `read_memory()` is the thin shell that reads the
container's cgroup (v2, else v1) or, with no limit, /proc/meminfo's MemAvailable.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MiB = 1024 * 1024
# Kept free under the limit whatever the state: the allocator, the page cache a write needs,
# the interpreter's own growth between two reads of the cgroup.
MARGIN_MIN = 256 * MiB
MARGIN_FRACTION = 0.10  # of the limit
# A chunk buffer never shrinks below this (fsutil.WRITE_PIECE, the size of one buffered write):
# smaller chunks only add copies and synchronisations.
MIN_CHUNK = 1 * MiB

_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1 = Path("/sys/fs/cgroup/memory")
_MEMINFO = Path("/proc/meminfo")
# cgroup v1 reports "no limit" as a huge page-aligned number (LONG_MAX rounded down).
_V1_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class Memory:
    """What the container may use and uses now, in bytes (`limit` None: no limit found)."""

    limit: int | None
    usage: int = 0
    reclaimable: int = 0  # inactive file pages: the kernel drops them before it OOM-kills
    available: int | None = None  # MemAvailable, where there is no cgroup limit


def budget(
    limit: int,
    usage: int,
    *,
    reclaimable: int = 0,
    held: int = 0,
    margin_min: int = MARGIN_MIN,
    margin_fraction: float = MARGIN_FRACTION,
) -> int:
    """Bytes a save may stage: the room under `limit` beside the working set (`usage` minus
    `reclaimable` page cache), plus the staging buffers this process already `held` (counted in
    `usage`, reused by the next save), minus a margin of max(`margin_min`, `margin_fraction` of
    the limit). Never negative."""
    if limit < 0 or usage < 0 or reclaimable < 0 or held < 0:
        raise ValueError("memory figures must be >= 0")
    working_set = max(0, usage - reclaimable)
    margin = max(margin_min, int(limit * margin_fraction))
    return max(0, limit - working_set + held - margin)


def budget_from(memory: Memory, *, held: int = 0) -> int:
    """The budget for what `read_memory` found: the cgroup's limit, else MemAvailable."""
    if memory.limit is not None:
        return budget(memory.limit, memory.usage, reclaimable=memory.reclaimable, held=held)
    if memory.available is not None:
        # MemAvailable already leaves out what is in use; the margin is taken from it alone.
        return budget(memory.available, 0, held=held)
    raise ValueError("no memory limit and no MemAvailable: nothing to size staging by")


def chunk_capacity(total: int, budget_bytes: int) -> int:
    """The size of the reused chunk buffer for `total` bytes to stage under `budget_bytes`."""
    return max(1, min(total, max(MIN_CHUNK, budget_bytes)))


@dataclass(frozen=True)
class Span:
    """Bytes [start, stop) of tensor number `tensor`, at `offset` in the chunk buffer."""

    tensor: int
    start: int
    stop: int
    offset: int

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


def plan_chunks(sizes: list[int], capacity: int) -> list[list[Span]]:
    """Every byte of the tensors of `sizes`, in order, in chunks of at most `capacity` bytes:
    a tensor larger than the room left is split across chunks; empty tensors have no span."""
    if capacity <= 0:
        raise ValueError(f"chunk capacity must be > 0, got {capacity}")
    chunks: list[list[Span]] = []
    current: list[Span] = []
    used = 0
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"tensor {i}: negative size {size}")
        start = 0
        while start < size:
            if used == capacity:
                chunks.append(current)
                current, used = [], 0
            n = min(size - start, capacity - used)
            current.append(Span(i, start, start + n, used))
            used += n
            start += n
    if current:
        chunks.append(current)
    return chunks


# ---------------------------------------------------------------------------- the thin shell


class KernelFiles:
    """Reads kernel-generated files (cgroup, /proc) through descriptors kept open, from offset 0
    each time: such a file is generated anew on every read, and opening it costs three times
    the read (20 against 6 us here), on the training thread at every save. A file that does not
    exist is remembered as missing: a process's cgroup files do not come and go."""

    def __init__(self) -> None:
        self._fds: dict[Path, int | None] = {}
        self._lock = threading.Lock()

    def read(self, path: Path) -> str | None:
        with self._lock:
            if path not in self._fds:
                try:
                    self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    self._fds[path] = None
            fd = self._fds[path]
        if fd is None:
            return None
        parts: list[bytes] = []
        try:
            while True:  # these files are a few KiB: one read, in practice
                part = os.pread(fd, 1 << 16, sum(map(len, parts)))
                parts.append(part)
                if len(part) < 1 << 16:
                    return b"".join(parts).decode(errors="replace")
        except OSError:
            return None

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                if fd is not None:
                    os.close(fd)
            self._fds.clear()


def _read_fresh(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


Read = Callable[[Path], "str | None"]


def _read_int(read: Read, path: Path) -> int | None:
    text = read(path)
    if text is None or (text := text.strip()) == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _field(text: str | None, name: str) -> str | None:
    """The value after `name` on its own line of a `key value` file (found, not split: this
    runs on the training thread at every save, and memory.stat has dozens of lines)."""
    if not text:
        return None
    if text.startswith(name):
        at = 0
    elif (at := text.find("\n" + name) + 1) == 0:
        return None
    end = text.find("\n", at)
    return text[at + len(name) : None if end < 0 else end]


def _stat_field(read: Read, path: Path, name: str) -> int:
    value = _field(read(path), name + " ")
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _mem_available(read: Read, meminfo: Path) -> int | None:
    value = _field(read(meminfo), "MemAvailable:")
    try:
        return int(value.split()[0]) * 1024 if value is not None else None  # kB
    except (ValueError, IndexError):
        return None


@functools.cache
def _cgroup_files(v2: Path, v1: Path) -> tuple[Path, ...]:
    # Joined once: pathlib joins and hashes cost more than the reads they name.
    return (
        v2 / "memory.max",
        v2 / "memory.current",
        v2 / "memory.stat",
        v1 / "memory.limit_in_bytes",
        v1 / "memory.usage_in_bytes",
        v1 / "memory.stat",
    )


def read_memory(
    v2: Path = _CGROUP_V2,
    v1: Path = _CGROUP_V1,
    meminfo: Path = _MEMINFO,
    *,
    read: Read = _read_fresh,
) -> Memory:
    """The container's memory limit and use: cgroup v2 (memory.max), else v1
    (memory.limit_in_bytes), else no limit with /proc/meminfo's MemAvailable."""
    v2_max, v2_current, v2_stat, v1_limit, v1_usage, v1_stat = _cgroup_files(v2, v1)
    limit = _read_int(read, v2_max)
    if limit is not None and (usage := _read_int(read, v2_current)) is not None:
        return Memory(limit, usage, _stat_field(read, v2_stat, "inactive_file"))
    limit = _read_int(read, v1_limit)
    if limit is not None and limit < _V1_UNLIMITED:
        usage = _read_int(read, v1_usage)
        if usage is not None:
            return Memory(limit, usage, _stat_field(read, v1_stat, "total_inactive_file"))
    return Memory(None, available=_mem_available(read, meminfo))


_KERNEL_FILES = KernelFiles()  # this process's own cgroup and /proc files


def staging_budget(override: int | None = None, *, held: int = 0) -> int:
    """The budget for the next save: `override` (KUBECKPT_STAGING_BUDGET_BYTES) where set, else
    from the container's memory now. Unreadable memory figures: no bound (the behaviour before
    budgets existed), rather than failing the save."""
    if override is not None:
        return override
    try:
        return budget_from(read_memory(read=_KERNEL_FILES.read), held=held)
    except ValueError:
        return 1 << 62
