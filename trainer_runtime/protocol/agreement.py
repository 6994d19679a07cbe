"""Cross-rank agreement on small facts: the one thing the protocol needs from a framework.

A framework adapter supplies an `Agreement` over whatever collective it has (a gloo group for
torch, `jax.experimental.multihost_utils` for JAX); the protocol only ever asks three questions:
the element-wise max of a few integers (does any rank want to stop, did any rank fail), every
rank's report (`all_gather`), and rank 0's answer (`broadcast`). `all_ok` and `barrier` are
derived from `all_max`, so an adapter implements four methods.

Every rank must make the same calls in the same order; a rank that does not answer within the
adapter's timeout makes the call raise `AgreementError` on the others, which the protocol turns
into a failed save (or a stop it reports it could not make), never a hang.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

# How long a collective waits for a silent rank. Long enough for a peer's slow save (a DCP save
# of many GB runs on the same group), short enough to fail before a typical grace period ends.
KUBECKPT_AGREEMENT_TIMEOUT = "KUBECKPT_AGREEMENT_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 600.0


def timeout_seconds() -> float:
    """`KUBECKPT_AGREEMENT_TIMEOUT` (seconds, at least 1): how long every adapter's collectives
    wait for a rank that does not answer."""
    try:
        seconds = float(os.environ.get(KUBECKPT_AGREEMENT_TIMEOUT, DEFAULT_TIMEOUT_SECONDS))
    except ValueError:
        seconds = DEFAULT_TIMEOUT_SECONDS
    return max(1.0, seconds)


class AgreementError(RuntimeError):
    """A collective failed or timed out: some rank did not answer."""


class Pending(ABC):
    """A max-reduction started by `Agreement.start_max`, answered by `wait()`."""

    @abstractmethod
    def wait(self) -> list[int]: ...


class _Done(Pending):
    def __init__(self, values: list[int]) -> None:
        self.values = values

    def wait(self) -> list[int]:
        return self.values


class Agreement(ABC):
    rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @abstractmethod
    def all_max(self, values: Sequence[int]) -> list[int]:
        """The element-wise max of `values` over every rank."""

    def start_max(self, values: Sequence[int]) -> Pending:
        """Start `all_max` without waiting for it; adapters with asynchronous collectives
        override this so the training thread never waits for the round trip."""
        return _Done(self.all_max(values))

    @abstractmethod
    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (small picklable objects only)."""

    @abstractmethod
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s `obj` on every rank."""

    def all_ok(self, ok: bool) -> bool:
        """True only if every rank says True."""
        return self.all_max([0 if ok else 1])[0] == 0

    def barrier(self) -> None:
        self.all_max([0])

    def pipelined(self) -> Pipelined:
        return Pipelined(self)


class Solo(Agreement):
    """A single process: every answer is its own."""

    def __init__(self) -> None:
        self.rank = 0
        self.world_size = 1

    def all_max(self, values: Sequence[int]) -> list[int]:
        return [int(v) for v in values]

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj


class Pipelined:
    """A per-step all_max whose answer is collected one call later.

    The reduction started at step N runs while step N+1 computes, and its answer is acted on at
    step N+1, on every rank alike: a stop lands one step after it was asked for, and the training
    thread never waits for a round trip. A single process has no one to wait for: its own values
    count at once.
    """

    def __init__(self, agreement: Agreement) -> None:
        self.agreement = agreement
        self._pending: Pending | None = None

    def exchange(self, values: Sequence[int]) -> list[int] | None:
        """Start the reduction of `values`; the previous call's answer (None at the first)."""
        if not self.agreement.distributed:
            return [int(v) for v in values]
        previous = self.collect()
        self._pending = self.agreement.start_max(values)
        return previous

    def collect(self) -> list[int] | None:
        """Wait for the reduction in flight (if any) and return its answer."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.wait()
