"""Cross-rank agreement on small facts, over a gloo group of its own.

The per-step check is one all_reduce(MAX) of a few int64s on CPU: "does any rank want to stop",
"is a periodic save due" (the time strategy reads rank 0's clock, so only rank 0 votes for it).
Every rank then saves at the same step and stops together. A group of its own keeps these calls
out of the user's collective order and off NCCL; it is created once, at start-up.

The per-step call is pipelined (`Pipelined`): the all_reduce started at step N runs while step N+1
computes, and its answer is acted on at step N+1, on every rank alike. A stop therefore lands one
step after it was asked for, and the training thread never waits for a round trip.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class Collectives:
    """all_reduce / all_gather / broadcast on one process group; trivial for a single process."""

    def __init__(self, group: Any, world_size: int, rank: int) -> None:
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self._flags = torch.zeros(8, dtype=torch.int64)

    @classmethod
    def create(cls) -> Collectives:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return cls(None, 1, 0)
        # Every rank must call new_group in the same order: the manager does so in __init__.
        group = dist.new_group(backend="gloo")
        return cls(group, dist.get_world_size(), dist.get_rank())

    @property
    def distributed(self) -> bool:
        return self.group is not None

    def all_max(self, values: list[int]) -> list[int]:
        if not self.distributed:
            return list(values)
        flags = self._flags[: len(values)]
        for i, v in enumerate(values):
            flags[i] = int(v)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return [int(x) for x in flags.tolist()]

    def pipelined(self, width: int) -> Pipelined:
        return Pipelined(self, width)

    def all_ok(self, ok: bool) -> bool:
        """True only if every rank says True."""
        if not self.distributed:
            return ok
        return self.all_max([0 if ok else 1])[0] == 0

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            self.all_max([0])


class Pipelined:
    """all_reduce(MAX) whose answer is collected one call later (see the module docstring)."""

    def __init__(self, comm: Collectives, width: int) -> None:
        self.comm = comm
        self._buffers = [torch.zeros(width, dtype=torch.int64) for _ in range(2)]
        self._which = 0
        self._work: Any = None
        self._last = self._buffers[0]

    def exchange(self, values: list[int]) -> list[int] | None:
        """Start the reduction of `values`; the previous call's reduced values (None at first).
        A single process has no one to wait for: its own values count at once."""
        if not self.comm.distributed:
            return list(values)
        previous = self.collect()
        buf = self._buffers[self._which]
        self._which ^= 1
        for i, v in enumerate(values):
            buf[i] = int(v)
        self._work = dist.all_reduce(
            buf, op=dist.ReduceOp.MAX, group=self.comm.group, async_op=True
        )
        self._last = buf
        return previous

    def collect(self) -> list[int] | None:
        """Wait for the reduction in flight (if any) and return it."""
        if self._work is None:
            return None
        self._work.wait()
        self._work = None
        return [int(x) for x in self._last.tolist()]
