"""N ranks as N threads of one process, for unit tests of the save protocol without torch.

`SimulatedGroup(n)` is a collective over threads: each call deposits this rank's value and waits
at a barrier for the others. A rank that never makes the call breaks the barrier after `timeout`
seconds, and every other rank's call raises `AgreementError`, as a gloo timeout does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from trainer_runtime.protocol import Agreement, AgreementError, Pending


class SimulatedGroup:
    def __init__(self, n: int, timeout: float = 5.0) -> None:
        self.n = n
        self.barrier = threading.Barrier(n, timeout=timeout)
        self.slots: list[Any] = [None] * n
        self.calls = [0] * n  # per rank: how many collectives it made

    def member(self, rank: int) -> SimulatedAgreement:
        return SimulatedAgreement(self, rank)


class SimulatedAgreement(Agreement):
    def __init__(self, group: SimulatedGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.n

    def _exchange(self, obj: Any) -> list[Any]:
        g = self.group
        g.calls[self.rank] += 1
        try:
            g.slots[self.rank] = obj
            g.barrier.wait()  # every rank has deposited
            out = list(g.slots)
            g.barrier.wait()  # every rank has read before the next call overwrites
        except threading.BrokenBarrierError as e:
            raise AgreementError(f"rank {self.rank}: a rank did not answer") from e
        return out

    def all_max(self, values: Sequence[int]) -> list[int]:
        rows = self._exchange([int(v) for v in values])
        return [max(column) for column in zip(*rows, strict=True)]

    def start_max(self, values: Sequence[int]) -> Pending:
        """Asynchronous, as gloo's is: the reduction completes once every rank has started it."""
        return _Thread(lambda: self.all_max(values))

    def all_gather(self, obj: Any) -> list[Any]:
        return self._exchange(obj)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self._exchange(obj)[src]


class _Thread(Pending):
    def __init__(self, fn: Callable[[], list[int]]) -> None:
        self.result: list[int] | None = None
        self.error: BaseException | None = None

        def body() -> None:
            try:
                self.result = fn()
            except BaseException as e:  # re-raised by wait()
                self.error = e

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def wait(self) -> list[int]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def run_ranks(n: int, fn: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """fn(rank) on n threads at once; their results in rank order (an exception is re-raised)."""
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # re-raised in the test's thread
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}") for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"{t.name} still running after {timeout} s"
    for rank, error in enumerate(errors):
        if error is not None:
            raise AssertionError(f"rank {rank} failed: {error!r}") from error
    return results
