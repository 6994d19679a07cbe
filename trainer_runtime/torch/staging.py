"""Staging: copy the state to CPU memory so training can go on while it is persisted.

Buffers are kept from one save to the next (allocating, and for CUDA pinning, a gigabyte costs more
than copying into it). Tensors that only `optimizer.step()` changes (parameters and optimizer state)
can be copied *late*: while the next forward/backward runs, on a side CUDA stream or a CPU thread.
The optimizer's step pre-hook then waits for that copy (on CUDA, the compute stream just waits on an
event, so the host never blocks). Everything else (buffers such as BatchNorm statistics, which
forward changes) is copied before the training step returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .state import DTensor, Path, iter_tensors, map_tensors
from .state import local_tensor as _local


class Staged:
    """One staged state: `tree` holds CPU tensors once `wait()` returned."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._late_event: Any = None  # torch.cuda.Event
        self._early_event: Any = None

    def wait_before_update(self) -> None:
        """Called before the next optimizer.step(): the late copies must have read their sources."""
        if self._thread is not None:
            self._thread.join()
        if self._late_event is not None:
            torch.cuda.current_stream().wait_event(self._late_event)

    def wait(self) -> None:
        """Block until every copy has landed in host memory (the persist thread calls this)."""
        if self._thread is not None:
            self._thread.join()
        for event in (self._early_event, self._late_event):
            if event is not None:
                event.synchronize()
        if self._error is not None:
            raise RuntimeError(f"staging the checkpoint failed: {self._error}") from self._error

    @property
    def pending_late(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


class Stager:
    def __init__(self) -> None:
        self._buffers: dict[Path, torch.Tensor] = {}
        self._stream: Any = None
        self._warming: threading.Thread | None = None

    def warm(self, tree: Any) -> None:
        """Allocate and touch the buffers for `tree` on a background thread.

        The first copy into fresh memory pays a page fault per page (about 0.4 s per GiB here),
        which would otherwise land in the first save's stall.
        """

        def run() -> None:
            for path, t in iter_tensors(tree):
                self._buffer(path, _local(t.detach())).fill_(0)

        self._warming = threading.Thread(target=run, name="kubeckpt-warm", daemon=True)
        self._warming.start()

    def _buffer(self, path: Path, src: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            # Pinned memory makes device-to-host copies asynchronous and full-speed.
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
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
        if self._warming is not None:
            self._warming.join()
            self._warming = None
        early: list[tuple[torch.Tensor, torch.Tensor]] = []
        deferred: list[tuple[torch.Tensor, torch.Tensor]] = []

        def stage_one(path: Path, t: torch.Tensor) -> Any:
            src = _local(t.detach())
            if not copy_cpu and src.device.type == "cpu" and src.is_contiguous():
                return t.detach()
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
                staged._thread = threading.Thread(
                    target=self._copy_all,
                    args=(staged, deferred),
                    name="kubeckpt-stage",
                    daemon=True,
                )
                staged._thread.start()
        return staged

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
