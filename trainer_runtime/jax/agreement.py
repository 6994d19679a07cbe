"""The protocol's `Agreement` over `jax.distributed`'s coordination service.

JAX has no host-side collective that a background thread may call while the training thread runs
jitted steps (its collectives are XLA computations over devices). The coordination service that
`jax.distributed.initialize` starts has a key-value store that any thread can use, and that orbax
uses for its own barriers: each call here is one round in a namespace of its own, in which every
process sets its key and reads everyone's. A process that does not answer within
`KUBECKPT_AGREEMENT_TIMEOUT` makes the read time out, which raises `AgreementError`.

A process deletes its key two rounds later: once it has finished round n, every process has set
its round-n key, which each does only after reading all round n-1 keys, so nobody needs round n-2.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from typing import Any

from ..protocol.agreement import Agreement, AgreementError, Pending, Solo, timeout_seconds
from ..protocol.commit import Member

PREFIX = "kubeckpt"
# The index of this process among those sharing a node's ramdisk (several processes per pod).
LOCAL_PROCESS_ENV = "JAX_LOCAL_PROCESS_ID"


def coordination_client() -> Any:
    """The coordination service client of `jax.distributed.initialize`, or None."""
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - a JAX without the module
        return None
    return getattr(distributed.global_state, "client", None)


class _Round(Pending):
    def __init__(self, agreement: KeyValueAgreement, seq: int) -> None:
        self.agreement = agreement
        self.seq = seq

    def wait(self) -> list[int]:
        rows = self.agreement._collect(self.seq)
        return [max(int(r[i]) for r in rows) for i in range(len(rows[0]))]


class KeyValueAgreement(Agreement):
    """all_max / all_gather / broadcast through the coordination service's key-value store."""

    def __init__(self, client: Any, name: str, rank: int, world_size: int) -> None:
        self.client = client
        self.name = name
        self.rank = rank
        self.world_size = world_size
        self.timeout_ms = int(timeout_seconds() * 1000)
        self._seq = 0

    def _key(self, seq: int, rank: int) -> str:
        return f"{PREFIX}/{self.name}/{seq}/{rank}"

    def _start(self, obj: Any) -> int:
        self._seq += 1
        try:
            self.client.key_value_set(self._key(self._seq, self.rank), json.dumps(obj))
        except Exception as e:  # the service is gone: the job is ending
            raise AgreementError(f"coordination service: {e}") from e
        return self._seq

    def _collect(self, seq: int) -> list[Any]:
        out = []
        for r in range(self.world_size):
            try:
                raw = self.client.blocking_key_value_get(self._key(seq, r), self.timeout_ms)
            except Exception as e:  # DEADLINE_EXCEEDED: process r did not answer in time
                raise AgreementError(f"process {r} did not answer: {e}") from e
            out.append(json.loads(raw))
        if seq > 2:
            try:
                self.client.key_value_delete(self._key(seq - 2, self.rank))
            except Exception:  # housekeeping only
                pass
        return out

    def all_max(self, values: Sequence[int]) -> list[int]:
        return self.start_max(values).wait()

    def start_max(self, values: Sequence[int]) -> Pending:
        return _Round(self, self._start([int(v) for v in values]))

    def all_gather(self, obj: Any) -> list[Any]:
        return self._collect(self._start(obj))

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        # Everyone takes part (so every round's keys clean up alike); only src's value counts.
        return self._collect(self._start(obj if self.rank == src else None))[src]


def groups(enabled: bool) -> tuple[Agreement, Agreement, Agreement]:
    """The per-step question's, the writer thread's and the stop watcher's agreements, each in a
    key namespace of its own so that one thread's rounds never interleave with another's."""
    import jax

    count = jax.process_count()
    if not enabled or count == 1:
        return Solo(), Solo(), Solo()
    client = coordination_client()
    if client is None:
        raise RuntimeError(
            "several JAX processes but no coordination service: call "
            "jax.distributed.initialize() before creating the CheckpointManager"
        )
    rank = jax.process_index()
    step, io, ctl = (KeyValueAgreement(client, n, rank, count) for n in ("step", "io", "ctl"))
    return step, io, ctl


def member(local_dir: str | None) -> Member:
    """This process's place in the job. JAX runs one process per pod in the usual setups, so
    the ramdisk's owner is the pod: the node identity is the host name plus the local tier's
    path, and the local rank is `JAX_LOCAL_PROCESS_ID` (0 when unset)."""
    import jax

    local = int(os.environ.get(LOCAL_PROCESS_ENV, "0") or 0)
    node = socket.gethostname() + (f":{local_dir}" if local_dir else "")
    return Member(jax.process_index(), local, jax.process_count(), node)
