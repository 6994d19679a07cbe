"""Resume: every rank agrees on one checkpoint, the newest complete one across both tiers.

1. A save still in flight from a pod being replaced is waited for (handover.py, on a shared
   volume or s3://), then incomplete checkpoints are removed (rank 0 for the shared tier, each
   node's local rank 0 for its ramdisk).
2. Candidates: the persistent tier as rank 0 lists it, every generation (broadcast, so all see
   one list), and the local steps that every rank holds (a ramdisk is per node: a step one node
   lacks is no candidate). Newest first by commit order (generations.py: the manifests'
   sequences, not step numbers, so a run that went on from an older checkpoint is newer than
   the one it abandoned); at an equal place the local copy first, being faster.
3. For each candidate: one process per copy fetches (a download for s3://) and verifies the files
   against the manifest; all agree; the framework reads what it needs without touching live state
   (`Loader.prepare`); all agree; then it loads in place (`Loader.apply`, may be collective); all
   agree. A candidate that fails anywhere is skipped on every rank alike, and named in the
   ResumeOutcome (resume_outcome.py decides whether starting from step 0 is allowed).

A loader that reads files whole anyway (`ContentCheckingLoader`: the torch plain format) checks
their content as it reads them when "none verifies" ends the process (onUnverifiableCheckpoints:
Fail, the default): the fetcher checks only their sizes, and restore reads them once, from the
device straight into the live tensors, instead of twice (docs/benchmarks.md, session 25). A
mismatch then comes after the load touched live state: an older candidate that loads replaces
it all (a strict load), and when none does the process stops anyway. Under StartFresh every file
is checked before any load, so step 0 starts from untouched weights.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from .. import handover, layout
from ..contract import ContentMismatch, Manifest, UnsupportedFormatVersion, read_manifest
from ..generations import Entry, commit_order
from ..storage import Tier
from .agreement import Agreement
from .commit import Member, describe
from .resume_outcome import (
    MAX_REASONS,
    UNLOADABLE,
    UNSUPPORTED,
    UNVERIFIED,
    Rejected,
    ResumeOutcome,
)

log = logging.getLogger("trainer_runtime.protocol")


class RestoreError(RuntimeError):
    """No checkpoint could be loaded after one was partly loaded in place: state is unusable."""


class Loader(Protocol):
    def prepare(self, path: Path, manifest: Manifest, tier: Tier) -> Any:
        """Read and check what the load needs, touching no live state; raise if unusable."""

    def apply(self, prepared: Any, path: Path, manifest: Manifest, tier: Tier) -> None:
        """Load into the live state (every rank calls it: it may be collective)."""


class ContentCheckingLoader(Loader, Protocol):
    """A Loader that can check files' content against the manifest while it loads them."""

    def verified_in_load(self, manifest: Manifest) -> Collection[str]:
        """The files (manifest paths) `apply` reads whole on this process and can check."""

    def apply(
        self,
        prepared: Any,
        path: Path,
        manifest: Manifest,
        tier: Tier,
        verify: frozenset[str] = frozenset(),
    ) -> None:
        """Load; the files in `verify` are checked as they are read (ContentMismatch naming
        each bad one, after whatever was read went into live state)."""


@dataclass
class Restored:
    step: int
    tier: Tier
    location: str
    manifest: Manifest
    path: Path  # where the files were read (a download for s3://)
    # The persistent generation its run wrote: the directory's for a persistent checkpoint, the
    # manifest's for a local copy (None: a local copy written before generations).
    generation: int | None = 0
    directory_generation: int = 0  # the generation directory it was read from in its tier


@dataclass(frozen=True)
class Candidate:
    """A checkpoint restore may load: `entry` (with its sequence) in `tier`."""

    entry: Entry
    tier: Tier

    @property
    def step(self) -> int:
        return self.entry.step


def remove_incomplete(io: Agreement, me: Member, persistent: Tier | None, local: Tier | None):
    # A pod being replaced may still be writing a newer checkpoint (to a shared volume or a
    # bucket): rank 0 waits for it before deleting leftovers; the other ranks at the barrier.
    if persistent is not None and me.rank == 0 and (sentinels := persistent.sentinels()):
        try:
            handover.wait_for_saves_in_flight(sentinels)
        except Exception as e:  # the clean-up below meets the same trouble, and says so
            log.warning("kubeckpt: cannot check for a save in flight: %s", e)
    try:
        if persistent is not None and me.rank == 0:
            persistent.remove_incomplete()
        if local is not None and me.local_rank == 0:
            local.remove_incomplete()
    except Exception as e:  # cleanup is best effort: a read-only tier must not stop a resume
        log.warning("kubeckpt: could not remove incomplete checkpoints: %s", e)
    io.barrier()


def same_world_size(me: Member, needs: str | None = None) -> Callable[[Tier, int], bool]:
    """The test of a local copy: written by a job of this world size (and listing the file
    `needs`, this rank's own part, when given)."""

    def usable(tier: Tier, step: int) -> bool:
        try:
            manifest = read_manifest(tier.write_dir(step))
        except (OSError, ValueError):
            return False
        if needs is not None and needs not in {f.path for f in manifest.files}:
            return False
        return manifest.world_size == me.world_size

    return usable


def candidates(
    io: Agreement,
    me: Member,
    persistent: Tier | None,
    local: Tier | None,
    local_usable: Callable[[Tier, int], bool],
) -> list[Candidate]:
    """Every checkpoint the ranks may load, newest by commit order first, the same on every rank."""
    listed: list[tuple[int, int, int | None]] = []  # (generation, step, sequence)
    if persistent is not None and me.rank == 0:
        try:
            complete = [e for e in persistent.scan() if e.complete]
            complete = persistent.with_sequences(complete)
            listed = [(e.generation, e.step, e.sequence) for e in complete]
        except Exception as e:
            log.warning("kubeckpt: cannot list %s: %s", persistent, e)
    listed = io.broadcast(listed)
    mine: list[tuple[int, int | None]] = []  # (step, sequence): the ramdisk has no generations
    if local is not None:
        try:
            usable = [e for e in local.scan() if e.complete and local_usable(local, e.step)]
            mine = [(e.step, e.sequence) for e in local.with_sequences(usable)]
        except Exception as e:
            log.warning("kubeckpt: cannot list %s: %s", local, e)
    # The steps every rank holds, each at the lowest place in commit order any node gives it
    # (0: a manifest without a sequence), so every rank computes the same order.
    common: dict[int, int] = {step: seq or 0 for step, seq in mine}
    for theirs in io.all_gather(mine):
        seqs = {step: seq or 0 for step, seq in theirs}
        common = {step: min(seq, seqs[step]) for step, seq in common.items() if step in seqs}
    found: list[Candidate] = []
    if local is not None:
        found += [
            Candidate(Entry(step, True, 0, seq or None), local) for step, seq in common.items()
        ]
    if persistent is not None:
        found += [Candidate(Entry(step, True, g, seq), persistent) for g, step, seq in listed]
    found.sort(key=lambda c: (commit_order(c.entry), c.tier is local), reverse=True)
    return found


def restore(
    io: Agreement,
    me: Member,
    found: list[Candidate],
    loader: Loader,
    *,
    checksums: bool | Callable[[int], bool] = True,
    keep_fetched: bool = False,
    unverifiable_stops: bool = False,
) -> tuple[Restored | None, ResumeOutcome]:
    """Load the first candidate that every rank can load (None when there is none), with what
    was passed over on the way (`resume_outcome.decide_resume` says what that means).

    `unverifiable_stops`: the caller ends the process when no candidate verifies, so a
    ContentCheckingLoader may check content during the load (the module's docstring).

    A candidate whose manifest has a format version this runtime does not know ends the search:
    nothing older is loaded in place of a newer runtime's checkpoint.

    `keep_fetched`: the restored copy of a remote checkpoint stays where `fetch` put it (the
    framework reads it later: the HF Trainer loads in `train()`); `Tier.release_fetched` drops it.
    """
    dirty = False
    rejected: list[Rejected] = []
    in_load = getattr(loader, "verified_in_load", None) if unverifiable_stops else None
    for candidate in found:
        restored, touched, rejection = _try(
            io, me, candidate, loader, checksums, keep_fetched, in_load
        )
        dirty = dirty or touched
        if restored is not None:
            return restored, ResumeOutcome(restored.step, tuple(rejected))
        if rejection is not None:
            rejected.append(rejection)
            if rejection.kind == UNSUPPORTED:
                break
    stops = any(
        r.kind == UNSUPPORTED or (unverifiable_stops and r.kind == UNVERIFIED) for r in rejected
    )
    if dirty and not stops:  # (when the process stops anyway, the outcome says why, by name)
        raise RestoreError(
            "every checkpoint failed to load after one was partly loaded into the model: "
            "the in-memory state is inconsistent; restart the process"
        )
    return None, ResumeOutcome(None, tuple(rejected))


def _try(
    io: Agreement,
    me: Member,
    candidate: Candidate,
    loader: Loader,
    checksums: bool | Callable[[int], bool],
    keep_fetched: bool,
    in_load: Callable[[Manifest], Collection[str]] | None = None,
) -> tuple[Restored | None, bool, Rejected | None]:
    """(what was restored, whether live state was touched, why it was passed over). Every rank
    makes the same collective calls whatever fails. `in_load`: the loader's verified_in_load,
    where it may check content while loading."""
    tier, step, generation = candidate.tier, candidate.step, candidate.entry.generation
    where = tier.location(step, generation)
    fetcher = me.fetches(tier)
    problems: list[str] = []
    unsupported = False
    deferred: frozenset[str] = frozenset()  # files whose content the load checks
    path = tier.fetch_dir(step, generation)
    if fetcher:
        try:
            path = tier.fetch(step, generation)
            fetched, problems = layout.verify_checkpoint(
                path, checksums=checksums, deferred=in_load
            )
            if in_load is not None and fetched is not None and not problems:
                on = checksums(fetched.total_size) if callable(checksums) else checksums
                deferred = frozenset(in_load(fetched)) if on else frozenset()
        except UnsupportedFormatVersion as e:
            problems, unsupported = [str(e)], True
        except Exception as e:
            problems = [f"cannot fetch: {describe(e)}"]
    if problems:
        log.warning("kubeckpt: skipping %s: %s", where, "; ".join(problems[:5]))
    restored: Restored | None = None
    try:
        if not io.all_ok(not problems):
            # Which kind of failure, agreed: a rank that checked nothing has no reasons to give.
            kind = UNVERIFIED if io.all_ok(not unsupported) else UNSUPPORTED
            reasons = tuple(problems[:MAX_REASONS]) or ("failed verification on another rank",)
            return None, False, Rejected(where, kind, reasons)
        manifest: Manifest | None = None
        prepared: Any = None
        why = ""
        try:
            manifest = read_manifest(path)
            prepared = loader.prepare(path, manifest, tier)
        except Exception as e:
            why = describe(e)
            log.warning("kubeckpt: skipping %s: %s", where, why)
            manifest = None
        if not io.all_ok(manifest is not None):
            return None, False, Rejected(where, UNLOADABLE, (why or "failed on another rank",))
        assert manifest is not None
        ok, mismatch = True, False
        try:
            if in_load is not None:
                checking = cast(ContentCheckingLoader, loader)
                checking.apply(prepared, path, manifest, tier, verify=deferred)
            else:
                loader.apply(prepared, path, manifest, tier)
        except ContentMismatch as e:
            problems, mismatch, ok = list(e.problems), True, False
            log.warning("kubeckpt: skipping %s: %s", where, "; ".join(problems[:5]))
        except Exception as e:
            why = describe(e)
            log.warning("kubeckpt: loading %s failed: %s", where, why)
            ok = False
        if not io.all_ok(ok):
            if io.all_ok(not mismatch):
                return None, True, Rejected(where, UNLOADABLE, (why or "failed on another rank",))
            reasons = tuple(problems[:MAX_REASONS]) or ("failed verification on another rank",)
            return None, True, Rejected(where, UNVERIFIED, reasons)
        # A ramdisk copy (no generations there) says which generation its run wrote.
        run_generation = manifest.generation if tier.name == "local" else generation
        restored = Restored(step, tier, where, manifest, path, run_generation, generation)
        return restored, True, None
    finally:
        io.barrier()
        if fetcher and not (keep_fetched and restored is not None):
            tier.release_fetched(step, generation)
