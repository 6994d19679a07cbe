"""Staging: copy the state to CPU memory so training can go on while it is persisted.

Buffers are kept from one save to the next (allocating, and for CUDA pinning, a gigabyte costs more
than copying into it). Tensors that only `optimizer.step()` changes (parameters and optimizer state)
can be copied *late*: while the next forward/backward runs, on a side CUDA stream or a CPU thread.
The optimizer's step pre-hook then waits for that copy (on CUDA, the compute stream just waits on an
event, so the host never blocks). Everything else (buffers such as BatchNorm statistics, which
forward changes) is copied before the training step returns.

A state larger than the staging budget (staging_budget.py) is not copied whole: `Chunked` copies
it piece by piece into one reused buffer of at most the budget, on the writer thread, each chunk
written before the next is copied. Training is held until the last chunk has been copied (the
optimizer's pre-step hook waits for it), so the stall grows while host memory stays within the
budget; the bytes written are the same as an unchunked save's.
"""

from __future__ import annotations

import logging
import mmap
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ..direct_write import ALIGN, PRIVATE
from ..staging_budget import chunk_capacity, plan_chunks
from .state import DTensor, Path, detached, iter_tensors, map_tensors
from .state import local_tensor as _local

log = logging.getLogger("trainer_runtime.torch")


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def host_buffer(shape: Any, dtype: torch.dtype, *, pin: bool) -> torch.Tensor:
    """An empty host tensor to stage into, page-aligned so that the plain writer can write it
    with O_DIRECT without a copy (direct_write). Pinned for a device source (CUDA's host
    allocator hands out page-aligned blocks); else, from ALIGN bytes on, an anonymous mapping of
    its own: torch's allocator aligns to 64 bytes only, and a tensor cut from a larger one would
    make DCP's writer clone it (it copies any tensor whose storage is larger than the tensor)."""
    size = torch.Size(shape)
    nbytes = size.numel() * dtype.itemsize
    if pin or nbytes < ALIGN:
        return torch.empty(size, dtype=dtype, pin_memory=pin)
    region = mmap.mmap(-1, nbytes, flags=PRIVATE)  # kept alive, then unmapped, by the tensor
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(size)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a 1-D uint8 tensor (no copy; any dtype)."""
    return t.detach().reshape(-1).view(torch.uint8)


class Staged:
    """One staged state: `tree` holds CPU tensors once `wait()` returned."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self._late: Future[None] | None = None  # the CPU copies on the stager's copier thread
        self._error: BaseException | None = None
        self._late_event: Any = None  # torch.cuda.Event
        self._early_event: Any = None

    def wait_before_update(self) -> None:
        """Called before the next optimizer.step(): the late copies must have read their sources."""
        if self._late is not None:
            self._late.result()
        if self._late_event is not None:
            torch.cuda.current_stream().wait_event(self._late_event)

    def wait(self) -> None:
        """Block until every copy has landed in host memory (the persist thread calls this)."""
        if self._late is not None:
            self._late.result()
        for event in (self._early_event, self._late_event):
            if event is not None:
                event.synchronize()
        if self._error is not None:
            raise RuntimeError(f"staging the checkpoint failed: {self._error}") from self._error

    @property
    def pending_late(self) -> bool:
        return self._late is not None and not self._late.done()


class Chunked(Staged):
    """A save staged chunk by chunk through one reused buffer (see the module docstring).

    `tree` is the live tree, with the tensors forward may change (and non-contiguous ones) staged
    whole at `stage` time; `stream` yields its bytes for plain.write_rank, copying each chunk
    into the buffer just before it is written. The live tensors are released to training once
    every planned write has copied its last chunk (`planned`), or when the save ends (`finished`).
    """

    def __init__(self, tree: Any, buffer: torch.Tensor, direct: set[int], ready: Any) -> None:
        super().__init__(tree)
        self.buffer = buffer
        self._direct = direct  # id() of tensors written from their own memory
        self._ready = ready  # torch.cuda.Event: the compute stream's work up to the save
        self._stream: Any = None
        self._released = threading.Event()
        self._writes_left = 1
        self._lock = threading.Lock()
        self.chunks_copied = 0

    def planned(self, writes: int) -> None:
        """The save writes the state this many times (one per tier)."""
        self._writes_left = max(1, writes)

    def wrote(self) -> None:
        """One planned write is done (a DCP write reads the live tensors to its end)."""
        with self._lock:
            self._writes_left -= 1
            if self._writes_left <= 0:
                self._released.set()

    def finished(self) -> None:
        """The save is over, committed or not: training may change the state again."""
        self._released.set()

    def wait_before_update(self) -> None:
        self._released.wait()

    @property
    def pending_late(self) -> bool:
        return not self._released.is_set()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def stream(self, tensors: list[torch.Tensor]) -> Iterator[tuple[int, int, memoryview]]:
        """(tensor number, byte offset, bytes) covering every tensor's bytes in order; a chunk's
        bytes stay valid until the next item after that chunk is asked for."""
        from .plain import _bytes_view

        local = [_local(t.detach()) for t in tensors]
        direct = [id(t) in self._direct for t in tensors]  # the tree's own objects
        sizes = [0 if d else nbytes(t) for d, t in zip(direct, local, strict=True)]
        chunks = plan_chunks(sizes, len(self.buffer)) if any(sizes) else []
        with self._lock:
            last_write = self._writes_left <= 1
        emitted = 0  # the direct tensors before this number have been yielded

        def directs_before(stop: int) -> Iterator[tuple[int, int, memoryview]]:
            nonlocal emitted
            for i in range(emitted, stop):
                if direct[i]:
                    yield i, 0, _bytes_view(local[i])
            emitted = max(emitted, stop)

        for n, chunk in enumerate(chunks):
            self._copy(local, chunk)
            self.chunks_copied += 1
            if n == len(chunks) - 1 and last_write:
                self._released.set()  # the buffer holds the rest: training may go on
            for span in chunk:
                yield from directs_before(span.tensor)
                view = _bytes_view(self.buffer[span.offset : span.offset + span.nbytes])
                yield span.tensor, span.start, view
        yield from directs_before(len(local))

    def _copy(self, local: list[torch.Tensor], chunk: list[Any]) -> None:
        cuda = [local[s.tensor] for s in chunk if local[s.tensor].is_cuda]
        if not cuda:
            for s in chunk:
                src = _flat_bytes(local[s.tensor])[s.start : s.stop]
                self.buffer[s.offset : s.offset + s.nbytes].copy_(src)
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=cuda[0].device)
        with torch.cuda.stream(self._stream):
            if self._ready is not None:
                self._stream.wait_event(self._ready)
            for s in chunk:
                src = _flat_bytes(local[s.tensor])[s.start : s.stop]
                self.buffer[s.offset : s.offset + s.nbytes].copy_(src, non_blocking=src.is_cuda)
            done = torch.cuda.Event()
            done.record(self._stream)
        done.synchronize()


class Stager:
    def __init__(self) -> None:
        self._buffers: dict[Path, torch.Tensor] = {}
        self._chunk_buffer: torch.Tensor | None = None
        self._stream: Any = None
        self._warming: Future[None] | None = None
        # One thread for the CPU copies (late ones, warming), kept: starting a thread per save
        # waits for the scheduler to run it, which on a busy node held training up for as long
        # as the rest of the save call (about 1 ms of 2 on two cores).
        self._copier: ThreadPoolExecutor | None = None

    def _copy_thread(self) -> ThreadPoolExecutor:
        if self._copier is None:
            self._copier = ThreadPoolExecutor(1, thread_name_prefix="kubeckpt-stage")
        return self._copier

    def close(self) -> None:
        """End the copier thread once its copies are done (idempotent)."""
        if self._copier is not None:
            self._copier.shutdown(wait=True)
            self._copier = None

    @property
    def held_bytes(self) -> int:
        """Host memory the stager keeps for the next save (counted in the process's use)."""
        self._join_warm()
        held = sum(nbytes(b) for b in self._buffers.values())
        return held + (0 if self._chunk_buffer is None else len(self._chunk_buffer))

    def _join_warm(self) -> None:
        warming, self._warming = self._warming, None
        if warming is not None and (error := warming.exception()) is not None:
            # The buffers are made on demand then; the first save faults their pages in.
            log.warning("kubeckpt: preparing the staging buffers failed: %s", error)

    def warm(self, tree: Any) -> None:
        """Allocate and touch the buffers for `tree` on the copier thread.

        The first copy into fresh memory pays a page fault per page (about 0.4 s per GiB here),
        which would otherwise land in the first save's stall.
        """

        def run() -> None:
            for path, t in iter_tensors(tree):
                self._buffer(path, _local(t.detach())).fill_(0)

        self._warming = self._copy_thread().submit(run)

    def _buffer(self, path: Path, src: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            # Pinned memory makes device-to-host copies asynchronous and full-speed.
            buf = host_buffer(src.shape, src.dtype, pin=src.is_cuda)
            self._buffers[path] = buf
        return buf

    def stage(
        self,
        tree: Any,
        *,
        late: Callable[[torch.Tensor], bool] | None = None,
        copy_cpu: bool = True,
    ) -> Staged:
        """Copy `tree` to CPU. Tensors for which `late(t)` holds are copied in the background.

        With `copy_cpu=False` CPU tensors are used as they are (a blocking save: nothing changes
        them until it is done), and only device tensors are copied.
        """
        self._join_warm()
        early: list[tuple[torch.Tensor, torch.Tensor]] = []
        deferred: list[tuple[torch.Tensor, torch.Tensor]] = []

        def stage_one(path: Path, t: torch.Tensor) -> Any:
            src = _local(detached(t))
            if not copy_cpu and src.is_cpu and src.is_contiguous():
                return detached(t)
            buf = self._buffer(path, src)
            (deferred if late is not None and late(src) else early).append((src, buf))
            if DTensor is not None and isinstance(t, DTensor):
                return DTensor.from_local(
                    buf,
                    t.device_mesh,
                    t.placements,
                    shape=t.shape,
                    stride=t.stride(),
                    run_check=False,
                )
            return buf

        staged = Staged(map_tensors(tree, stage_one))
        cuda = any(src.is_cuda for src, _ in early + deferred)
        if cuda:
            self._stage_cuda(staged, early, deferred)
        else:
            for src, buf in early:
                buf.copy_(src)
            if deferred:
                staged._late = self._copy_thread().submit(self._copy_all, staged, deferred)
        return staged

    def stage_bytes(self, tree: Any, *, copy_cpu: bool = True) -> int:
        """Bytes `stage(tree, copy_cpu=...)` copies to host memory."""
        total = 0
        for _, t in iter_tensors(tree):
            src = _local(detached(t))
            if copy_cpu or not src.is_cpu or not src.is_contiguous():
                total += src.nbytes
        return total

    def stage_chunked(
        self,
        tree: Any,
        budget: int,
        *,
        late: Callable[[torch.Tensor], bool] | None = None,
        copy_cpu: bool = True,
    ) -> Chunked:
        """A state larger than `budget`: the full-size buffers are given up; what forward may
        change (tensors `late` does not hold for, where `late` is given) and non-contiguous
        tensors are copied now; the rest is copied chunk by chunk as it is written."""
        self._join_warm()
        self._buffers.clear()  # a full second copy is what the budget rules out
        whole: list[tuple[Path, torch.Tensor]] = []
        chunked_bytes = 0
        direct: set[int] = set()

        def plan(path: Path, t: torch.Tensor) -> Any:
            nonlocal chunked_bytes
            src = _local(detached(t))
            if not copy_cpu and src.is_cpu and src.is_contiguous():
                direct.add(id(t))
                return t  # a blocking save: nothing changes it until it is written
            if not src.is_contiguous() or (late is not None and not late(src)):
                whole.append((path, src))
                return t
            chunked_bytes += nbytes(src)
            return t

        map_tensors(tree, plan)
        staged_whole: dict[Path, torch.Tensor] = {}
        for path, src in whole:
            buf = host_buffer(src.shape, src.dtype, pin=src.is_cuda)
            buf.copy_(src)  # small: BatchNorm statistics and the like
            self._buffers[path] = buf
            staged_whole[path] = buf
            direct.add(id(buf))

        def substitute(path: Path, t: torch.Tensor) -> Any:
            buf = staged_whole.get(path)
            if buf is None:
                return t
            if DTensor is not None and isinstance(t, DTensor):
                wrapped = DTensor.from_local(
                    buf,
                    t.device_mesh,
                    t.placements,
                    shape=t.shape,
                    stride=t.stride(),
                    run_check=False,
                )
                direct.add(id(wrapped))
                return wrapped
            return buf

        live = map_tensors(tree, substitute)
        room = budget - sum(nbytes(b) for b in staged_whole.values())
        capacity = chunk_capacity(max(1, chunked_bytes), room)
        cuda = any(_local(t).is_cuda for _, t in iter_tensors(tree))
        if cuda:  # pinned memory comes from CUDA's host allocator in powers of two
            capacity = 1 << (capacity.bit_length() - 1)
        buf = self._chunk_buffer
        if buf is None or len(buf) != capacity or buf.is_pinned() != cuda:
            self._chunk_buffer = None
            buf = host_buffer((capacity,), torch.uint8, pin=cuda)
            self._chunk_buffer = buf
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream())
        return Chunked(live, buf, direct, ready)

    def drop_chunk_buffer(self) -> None:
        self._chunk_buffer = None

    @staticmethod
    def _copy_all(staged: Staged, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        try:
            for src, buf in pairs:
                buf.copy_(src)
        except BaseException as e:  # reported by Staged.wait() in the persist thread
            staged._error = e

    def _stage_cuda(
        self,
        staged: Staged,
        early: list[tuple[torch.Tensor, torch.Tensor]],
        deferred: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        side = self._stream
        # The copies must see the values the compute stream has produced so far.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for src, buf in early:
                buf.copy_(src, non_blocking=True)
            staged._early_event = torch.cuda.Event()
            staged._early_event.record(side)
            for src, buf in deferred:
                buf.copy_(src, non_blocking=True)
            staged._late_event = torch.cuda.Event()
            staged._late_event.record(side)
        # Buffers (BatchNorm statistics...) are changed by the next forward: wait for them now.
        torch.cuda.current_stream().wait_event(staged._early_event)
        # Only device tensors have a caching allocator to tell; a CUDA model's state can hold CPU
        # tensors too (Adam's `step` counts), on which record_stream does not exist.
        for src, _ in early + deferred:
            if src.is_cuda:
                src.record_stream(side)
