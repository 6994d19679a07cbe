"""Committing one checkpoint to one tier, across every rank: DESIGN.md's layout protocol, once.

    begin      the coordinator creates `checkpoint-<step>/` holding only the sentinel; all agree
    write      every rank writes and fsyncs its own files (the framework's part) and publishes them
    report     every rank's files, sizes and checksums are gathered: the manifest is built from
               these reports, so no rank's completion hides in a marker file another rank shares
    commit     the coordinator writes the manifest last (with the checkpoint's sequence in commit
               order and its run's generation, generations.py) and removes the sentinel, then
               retention; or, when any rank failed, discards the directory; all agree on the
               outcome

The coordinator is rank 0 for a shared tier (a volume, a bucket) and each node's local rank 0 for
a per-node one (the ramdisk), whose manifest lists that node's files only. Every rank makes the
same collective calls in the same order whatever fails, so one rank's error never leaves another
waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..contract import MANIFEST_GENERATION, MANIFEST_SEQUENCE, Manifest
from ..storage import Tier
from .agreement import Agreement

log = logging.getLogger("trainer_runtime.protocol")


class FileInfo(Protocol):
    """What a rank reports of one file it wrote (the torch and HF writers' `WrittenFile`)."""

    path: str
    size: int
    checksum: str  # contract.format_checksum: a bare SHA-256 hex digest, or "<algorithm>:<hex>"


@dataclass(frozen=True)
class Member:
    """This process's place in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    node: str = ""

    def coordinates(self, tier: Tier) -> bool:
        """Whether this process begins and commits `tier`'s checkpoints: global rank 0 where one
        checkpoint serves every node (a shared volume, a bucket), else each node's local rank 0."""
        return self.local_rank == 0 if not tier.shared else self.rank == 0

    def fetches(self, tier: Tier) -> bool:
        """Whether this process fetches a checkpoint of `tier` for a restore: one process per
        copy, so each node's local rank 0 where every node reads a copy of its own (the ramdisk;
        a bucket's download), else global rank 0."""
        return self.local_rank == 0 if tier.copy_per_node else self.rank == 0


@dataclass
class Report:
    """One rank's account of its part of a save."""

    rank: int
    node: str
    ok: bool
    error: str | None = None
    files: list[tuple[str, int, str]] = field(default_factory=list)  # (path, size, checksum)
    # Steps this rank's node asks every other node to keep of its own (SpareExchange.wanted).
    spare: list[int] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "ok": self.ok,
            "error": self.error,
            "files": self.files,
            "spare": self.spare,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Report:
        return cls(
            rank=data["rank"],
            node=data["node"],
            ok=data["ok"],
            error=data["error"],
            files=[tuple(f) for f in data["files"]],  # type: ignore[misc]
            spare=[int(s) for s in data.get("spare", ())],
        )


@dataclass
class Outcome:
    ok: bool
    location: str | None = None
    error: str | None = None
    bytes_written: int = 0  # by this rank
    sequence: int = 0  # its place in commit order (the coordinator's; the proposal elsewhere)


class SpareExchange(Protocol):
    """Steps the nodes ask one another to keep at a commit of a per-node tier (the peer copies
    of the ramdisk: a replacement of node i can fetch its copy of step S only if every other
    node still has S of its own, and only node i knows which step its copy is of)."""

    def wanted(self) -> list[int]:
        """What this node asks every other node to keep of its own."""

    def asked(self, steps: set[int]) -> None:
        """What the other nodes asked, told before this node's retention runs."""


# (tier, the reports the manifest describes) -> the manifest; coordinator only.
ManifestBuilder = Callable[[Tier, list[Report]], Manifest]
# (tier, directory) -> this rank's files, written and fsynced; may run collectives of its own.
Writer = Callable[[Tier, Path], Iterable[FileInfo]]


def describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 500 else text[:497] + "..."


class TierCommit:
    """The protocol above for one (tier, step); `run` does it all, or `begin` and `finish` around
    a write that happens elsewhere (the HF Trainer's own synchronous save)."""

    def __init__(
        self,
        io: Agreement,
        me: Member,
        tier: Tier,
        step: int,
        *,
        manifest: ManifestBuilder,
        keep: int | None,
        sequence: int = 1,
        generation: int = 0,
        committed: Callable[[int], None] | None = None,
        spares: SpareExchange | None = None,
    ) -> None:
        """`keep`: retention after the commit (None: none); `sequence`: the run's count for this
        save (the coordinator raises it above what the generation holds); `generation`: the one
        the run writes in the persistent tier, recorded in every tier's manifest; `committed`
        is told the sequence a successful commit used; `spares`: the steps the nodes ask one
        another to keep, exchanged in the commit's gather of reports."""
        self.io = io
        self.me = me
        self.tier = tier
        self.step = step
        self.build_manifest = manifest
        self.keep = keep
        self.sequence = sequence
        self.generation = generation
        self.committed = committed
        self.spares = spares
        self.coordinator = me.coordinates(tier)

    @property
    def directory(self) -> Path:
        return self.tier.write_dir(self.step)

    def run(self, write: Writer) -> Outcome:
        error = self.begin()
        if error is not None:
            return Outcome(False, error=error)
        files: list[FileInfo] = []
        local_error: str | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except Exception as e:
            local_error = describe(e)
        # A writer may be collective (DCP): enter it on every rank or on none.
        if self.io.all_ok(local_error is None):
            try:
                files = list(write(self.tier, self.directory))
            except Exception as e:
                local_error = describe(e)
        else:
            local_error = local_error or "another rank could not create the checkpoint directory"
        return self.finish(files, local_error)

    def begin(self) -> str | None:
        """The sentinel, agreed; None, or why the save cannot start (a failure everywhere)."""
        error: str | None = None
        if self.coordinator:
            try:
                self.tier.begin(self.step)
            except Exception as e:
                error = describe(e)
        if not self.io.all_ok(error is None):
            if self.coordinator and error is None:
                self._discard()
            return error or "another rank could not start the checkpoint"
        return None

    def finish(self, files: Iterable[FileInfo], error: str | None) -> Outcome:
        """Publish this rank's files, gather every report, commit or discard: agreed."""
        files = list(files)
        if error is None:
            try:
                self.tier.publish(self.step, [f.path for f in files])
            except Exception as e:
                error = f"upload: {describe(e)}"
        mine = Report(
            rank=self.me.rank,
            node=self.me.node,
            ok=error is None,
            error=error,
            files=[(f.path, f.size, f.checksum) for f in files],
            spare=self._wanted(),
        )
        reports = [Report.from_wire(r) for r in self.io.all_gather(mine.to_wire())]
        if self.spares is not None:
            self.spares.asked({s for r in reports if r.node != self.me.node for s in r.spare})
        failures = [f"rank {r.rank}: {r.error}" for r in reports if not r.ok]
        location = self.tier.location(self.step)
        commit_error: str | None = None
        if self.coordinator:
            if failures:
                self._discard()
            else:
                try:
                    described = [r for r in reports if self.tier.shared or r.node == self.me.node]
                    manifest = self.build_manifest(self.tier, described)
                    self.sequence = self._next_sequence()
                    manifest.extra[MANIFEST_SEQUENCE] = self.sequence
                    manifest.extra[MANIFEST_GENERATION] = self.generation
                    location = self.tier.commit(self.step, manifest)
                except Exception as e:
                    commit_error = describe(e)
                    self._discard()
                else:
                    self._retain()
        committed = self.io.all_ok(commit_error is None)
        self.tier.release(self.step)
        size = sum(f.size for f in files)
        if failures:
            return Outcome(False, error="; ".join(failures), bytes_written=size)
        if not committed:
            return Outcome(
                False, error=commit_error or "commit failed on another node", bytes_written=size
            )
        if self.committed is not None:
            self.committed(self.sequence)
        return Outcome(True, location=location, bytes_written=size, sequence=self.sequence)

    def _wanted(self) -> list[int]:
        if self.spares is None:
            return []
        try:
            return sorted(self.spares.wanted())
        except Exception as e:  # only a copy's use is at stake, never the commit
            log.warning("kubeckpt: cannot say which steps the peer copies need: %s", describe(e))
            return []

    def _next_sequence(self) -> int:
        try:
            return self.tier.next_sequence(self.sequence)
        except Exception as e:  # the listing failed: the run's own count still orders this run
            log.warning("kubeckpt: cannot read the commit order of %s: %s", self.tier, e)
            return self.sequence

    def _retain(self) -> None:
        """Retention after a commit. Its failure is logged, never the commit's: the checkpoint
        is durable, and the next commit tries again."""
        if self.keep is None:
            return
        try:
            self.tier.retain(self.keep)
        except Exception as e:
            log.warning("kubeckpt: retention in %s failed: %s", self.tier, describe(e))

    def _discard(self) -> None:
        try:
            self.tier.discard(self.step)
        except Exception as e:
            log.warning("kubeckpt: could not remove the failed checkpoint %s: %s", self.step, e)
