"""The protocol's `Agreement` over a gloo group of its own.

The per-step question is one all_reduce(MAX) of a few int64s on CPU, started asynchronously
(`start_max`) so the protocol can pipeline it. A group of its own keeps these calls out of the
user's collective order and off NCCL; it is created once, at start-up, with a timeout: a rank
that stops answering fails the save (or the stop) on the others instead of hanging them until
the kubelet's SIGKILL.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..protocol.agreement import Agreement, AgreementError, Pending, timeout_seconds
from ..protocol.commit import Member

log = logging.getLogger("trainer_runtime.torch")


def _timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=timeout_seconds())


class _Work(Pending):
    def __init__(self, work: Any, buf: torch.Tensor) -> None:
        self.work = work
        self.buf = buf

    def wait(self) -> list[int]:
        try:
            self.work.wait()
        except RuntimeError as e:  # gloo: a timeout or a peer that went away
            raise AgreementError(str(e)) from e
        return [int(x) for x in self.buf.tolist()]


class Collectives(Agreement):
    """all_reduce / all_gather / broadcast on one process group; trivial for a single process."""

    def __init__(self, group: Any, world_size: int, rank: int) -> None:
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self._flags = torch.zeros(8, dtype=torch.int64)
        # Two buffers for start_max: the pipelined exchange has at most one reduction in flight
        # while the next is started.
        self._async = [torch.zeros(8, dtype=torch.int64) for _ in range(2)]
        self._which = 0

    @classmethod
    def create(cls) -> Collectives:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return cls(None, 1, 0)
        # Every rank must call new_group in the same order: the adapters do so at start-up.
        group = dist.new_group(backend="gloo", timeout=_timeout())
        return cls(group, dist.get_world_size(), dist.get_rank())

    @property
    def distributed(self) -> bool:
        return self.group is not None

    def all_max(self, values: Sequence[int]) -> list[int]:
        if not self.distributed:
            return [int(v) for v in values]
        flags = self._flags[: len(values)]
        for i, v in enumerate(values):
            flags[i] = int(v)
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        except RuntimeError as e:
            raise AgreementError(str(e)) from e
        return [int(x) for x in flags.tolist()]

    def start_max(self, values: Sequence[int]) -> Pending:
        if not self.distributed:
            return super().start_max(values)
        buf = self._async[self._which][: len(values)]
        self._which ^= 1
        for i, v in enumerate(values):
            buf[i] = int(v)
        try:
            work = dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        except RuntimeError as e:
            raise AgreementError(str(e)) from e
        return _Work(work, buf)

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as e:
            raise AgreementError(str(e)) from e
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        try:
            dist.broadcast_object_list(box, src=src, group=self.group)
        except RuntimeError as e:
            raise AgreementError(str(e)) from e
        return box[0]

    def destroy(self) -> None:
        """Destroy the group once every rank is done with it (the barrier). Left to interpreter
        exit, the process can abort there (SIGABRT, exit 134), failing a job that trained and
        saved correctly: when gloo's worker thread drops its reference to the last collective's
        tensor it takes the GIL, and a thread that takes the GIL while the interpreter finalizes
        is ended inside that C++ destructor (std::terminate). Destroying the group joins its
        worker threads first; a rank whose peer has already exited fails the barrier instead."""
        if self.group is None:
            return
        try:
            self.barrier()
            dist.destroy_process_group(self.group)
        finally:
            self.group = None
            self.world_size = 1


def destroy_groups(comms: Iterable[Collectives | None]) -> None:
    """Destroy the adapter's groups at its close (`Collectives.destroy`); a failure is logged,
    never raised: tear-down must not fail a finished run."""
    for comm in comms:
        if comm is None or not comm.distributed:
            continue
        try:
            comm.destroy()
        except Exception as e:
            log.warning("kubeckpt: cannot destroy the agreement group: %s", e)


def member() -> Member:
    """This process's place in the job, from torch.distributed and torchrun's LOCAL_RANK."""
    initialized = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if initialized else 0
    world_size = dist.get_world_size() if initialized else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if world_size > 1 else 0
    return Member(rank, local_rank, world_size, socket.gethostname())


def groups(enabled: bool) -> tuple[Collectives, Collectives, Collectives]:
    """The adapters' three groups, created in the same order on every rank: the training
    thread's per-step question, the writer thread's save, the stop watcher's. Trivial ones when
    checkpointing is off (no group is created at all)."""
    if not enabled:
        return Collectives(None, 1, 0), Collectives(None, 1, 0), Collectives(None, 1, 0)
    return Collectives.create(), Collectives.create(), Collectives.create()
