"""One save in flight: the training thread stages, one writer thread commits, in order.

The framework's part is a `Staged` save: `prepare()` (on the writer thread: wait for copies still
landing) and `write(tier, directory)` (this rank's files). The session runs them through the
commit protocol for each tier on the writer thread, over its own agreement, so the per-step
agreement of the training thread never waits behind a save's collectives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..contract import REASON_PERIODIC, Manifest
from ..storage import Tier
from .agreement import Agreement
from .commit import (
    FileInfo,
    ManifestBuilder,
    Member,
    Report,
    SpareExchange,
    TierCommit,
    describe,
)

# (tier, step, epoch, the reports it describes) -> the manifest (coordinator only).
# (tier, step, epoch, reports, reason) -> the manifest (Checkpointer.manifest)
ManifestFactory = Callable[[Tier, int, int, list[Report], str], Manifest]

log = logging.getLogger("trainer_runtime.protocol")


class Staged(Protocol):
    """A framework's copy of one rank's state, ready to be written."""

    def prepare(self) -> None:
        """On the writer thread, before the first write: wait for copies still in flight."""

    def write(self, tier: Tier, directory: Path) -> Iterable[FileInfo]:
        """This rank's files for `tier`, written and fsynced in `directory`."""


# Optional on a Staged: `planned(tiers)`, told before the first write which tiers will be
# written, and `finished()`, after the last, whatever happened. A save staged in chunks reads the
# live state while it writes (torch/staging.py) and frees training by them.


def _tell(staged: Staged, hook: str, *args: object) -> None:
    method = getattr(staged, hook, None)
    if method is not None:
        method(*args)


@dataclass
class SaveResult:
    """What became of one save. `locations` maps tier name to where it landed."""

    step: int
    ok: bool
    reason: str = REASON_PERIODIC
    locations: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    save_seconds: float = 0.0  # from the snapshot until durable everywhere
    stall_seconds: float = 0.0  # how long the training thread was held up
    persist_seconds: float = 0.0  # the writer thread's part: write, fsync, hash, commit
    bytes_written: int = 0  # by this rank
    # Why this rank's save was not staged whole (the staging budget), from the Staged's own
    # `staging_note` where it has one: training was held while it was written.
    staging_note: str | None = None


@dataclass
class _InFlight:
    future: Future[SaveResult]
    step: int
    stall: float


class SaveSession:
    def __init__(
        self,
        io: Agreement,
        me: Member,
        *,
        manifest: ManifestFactory,
        keep: Callable[[Tier], int | None],
        on_result: Callable[[SaveResult], None],
        spares: Callable[[Tier], SpareExchange | None] | None = None,
    ) -> None:
        self.io = io
        self.spares = spares  # per tier: the steps the nodes ask one another to keep
        self.me = me
        self.manifest = manifest
        self.keep = keep
        self.on_result = on_result
        # Commit order (generations.py): the highest sequence this run has drawn or seen
        # committed. Every save draws the next, the same on every rank (every rank makes the same
        # saves in the same order) unless a coordinator had to raise it above a checkpoint
        # another writer committed meanwhile. Checkpointer.plan starts it above what storage
        # holds.
        self.sequence = 0
        # The generation the run writes in the persistent tier (recorded in every manifest).
        self.generation = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kubeckpt-persist")
        self._in_flight: _InFlight | None = None
        # The training thread and the stop watcher both submit and wait (never at once in
        # practice: a stop holds the training thread), so the hand-over of `_in_flight` is locked.
        self._lock = threading.RLock()
        self._sequence_lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._in_flight is not None and not self._in_flight.future.done()

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def add_stall(self, seconds: float) -> None:
        """Training waited this long for the save in flight (before the next optimizer step)."""
        if self._in_flight is not None:
            self._in_flight.stall += seconds

    def submit(
        self,
        staged: Staged,
        step: int,
        epoch: int,
        tiers: list[Tier],
        *,
        reason: str = REASON_PERIODIC,
        started: float,
        stall: float,
        blocking: bool = False,
        written: Callable[[], None] | None = None,
    ) -> SaveResult | None:
        """Persist `staged` to `tiers` on the writer thread; with `blocking`, its result.
        `written` is called on the writer thread once the save is written or has failed."""
        with self._lock:
            self.wait()  # one save in flight at most
            sequence = self.draw_sequence()
            try:
                future = self._executor.submit(
                    self._run, staged, step, epoch, tiers, reason, started, sequence, written
                )
            except BaseException:
                if written is not None:
                    written()
                raise
            self._in_flight = _InFlight(future, step, stall)
            return self.wait() if blocking else None

    def commit(
        self,
        tier: Tier,
        step: int,
        epoch: int,
        *,
        manifest: ManifestBuilder | None = None,
        reason: str = REASON_PERIODIC,
        sequence: int | None = None,
    ) -> TierCommit:
        """The commit protocol for one tier; called directly for a write the framework makes
        itself, on the calling thread (with no save in flight). `sequence`: the save's place in
        commit order (None: the next one is drawn)."""

        def build(t: Tier, reports: list[Report]) -> Manifest:
            return self.manifest(t, step, epoch, reports, reason)

        return TierCommit(
            self.io,
            self.me,
            tier,
            step,
            manifest=manifest or build,
            keep=self.keep(tier),
            sequence=self.draw_sequence() if sequence is None else sequence,
            generation=self.generation,
            committed=self._committed,
            spares=self.spares(tier) if self.spares is not None else None,
        )

    def draw_sequence(self) -> int:
        with self._sequence_lock:
            self.sequence += 1
            return self.sequence

    def _committed(self, sequence: int) -> None:
        # On the writer thread, while the training thread may hold `_lock` waiting for it.
        with self._sequence_lock:
            self.sequence = max(self.sequence, sequence)

    def reap(self) -> SaveResult | None:
        """The result of a save that has finished (None while it still runs)."""
        in_flight = self._in_flight
        if in_flight is not None and in_flight.future.done():
            return self.wait()
        return None

    def wait(self) -> SaveResult | None:
        """Block until the save in flight (if any) is durable or has failed; its result."""
        with self._lock:
            in_flight, self._in_flight = self._in_flight, None
            if in_flight is None:
                return None
            result = in_flight.future.result()
            result.stall_seconds = in_flight.stall
            self.on_result(result)
            return result

    def shutdown(self) -> None:
        self.wait()
        self._executor.shutdown(wait=True)

    def _run(
        self,
        staged: Staged,
        step: int,
        epoch: int,
        tiers: list[Tier],
        reason: str,
        started: float,
        sequence: int,
        written: Callable[[], None] | None = None,
    ) -> SaveResult:
        """The writer thread. Any failure, a rank that stops answering included, is a failed
        save: it is reported, never raised into training."""
        result = SaveResult(step=step, ok=True, reason=reason)
        result.staging_note = getattr(staged, "staging_note", None)
        try:
            error: str | None = None
            try:
                staged.prepare()
            except Exception as e:
                error = f"staging: {describe(e)}"
            if not self.io.all_ok(error is None):
                result.ok = False
                result.error = error or "staging failed on another rank"
                return result
            t1 = time.monotonic()
            _tell(staged, "planned", tiers)
            for tier in tiers:
                commit = self.commit(tier, step, epoch, reason=reason, sequence=sequence)
                outcome = commit.run(staged.write)
                result.bytes_written += outcome.bytes_written
                if outcome.ok and outcome.location is not None:
                    result.locations[tier.name] = outcome.location
                else:
                    result.ok = False
                    result.error = f"{tier.name} tier: {outcome.error}"
            result.persist_seconds = time.monotonic() - t1
        except Exception as e:  # the agreement itself failed: a rank is gone or hangs
            result.ok = False
            result.error = f"agreement: {describe(e)}"
        finally:
            _tell(staged, "finished")
            if written is not None:
                written()
        result.save_seconds = time.monotonic() - started
        return result
