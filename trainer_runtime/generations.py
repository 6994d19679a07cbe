"""Generations and commit order: which checkpoints a run may delete, where it writes, what resumes.

Pure decisions (no I/O); the tiers (storage.py, layout.py) list what is there and act on them.

- Commit order: a checkpoint's manifest carries a sequence number (MANIFEST_SEQUENCE), one more
  than the highest in its generation when its writer committed it and never lower than the run's
  own count (`next_sequence`). Nothing in it comes from a clock, so nodes never need to agree on
  the time. A manifest without one (written before sequences existed) is older than any with one;
  such manifests order among themselves by step, as retention did before.
- Generations: CHECKPOINT_URI itself is generation 0, `generation-<N>/` beside its checkpoints is
  generation N. A run writes one generation (`choose_generation`): the one it resumed from, or a
  new one when it does not resume while complete checkpoints exist (`kubeckpt.io/resume: "false"`
  on a re-created job) or when none of them could be loaded, so it deletes nothing it did not
  supersede.
- Retention (`expired`) acts only in the generation being written and goes by commit order, so a
  run that starts again at a lower step (re-created, or resumed from an older checkpoint because
  the newest was corrupt) never has its own new checkpoints deleted before the older ones.
- Resume takes the newest complete checkpoint by commit order across every generation and tier.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One `checkpoint-<step>` directory found in a tier.

    `sequence` is read from the manifest of a complete checkpoint where the caller needed it
    (None: not read, or a manifest without one)."""

    step: int
    complete: bool
    generation: int = 0
    sequence: int | None = None


def commit_order(entry: Entry) -> tuple[int, int]:
    """Sort key, oldest first: the sequence (0 for a manifest without one), then the step."""
    return (entry.sequence or 0, entry.step)


def newest_first(entries: Iterable[Entry]) -> list[Entry]:
    """The complete checkpoints among `entries`, the newest by commit order first."""
    return sorted((e for e in entries if e.complete), key=commit_order, reverse=True)


def expired(entries: Iterable[Entry], generation: int, keep: int) -> list[Entry]:
    """What retention deletes, oldest first: the complete checkpoints of `generation` beyond the
    `keep` newest by commit order (the newest is always kept). Other generations are never
    touched."""
    mine = [e for e in newest_first(entries) if e.generation == generation]
    return mine[max(1, keep) :][::-1]


def next_sequence(proposed: int, entries: Iterable[Entry]) -> int:
    """The sequence of a checkpoint committed now: the run's own count (`proposed`: the same
    on every rank, so both tiers of one save agree), raised above every sequence in `entries`
    (the generation being written) so that a checkpoint another writer committed meanwhile is
    never taken for newer."""
    highest = max((e.sequence or 0 for e in entries if e.complete), default=0)
    return max(proposed, highest + 1, 1)


def highest_sequence(entries: Iterable[Entry]) -> int:
    return max((e.sequence or 0 for e in entries if e.complete), default=0)


def choose_generation(
    entries: Iterable[Entry],
    *,
    resume: bool,
    resumed: bool = False,
    restored: int | None = None,
    existing: Iterable[int] = (),
) -> int:
    """The generation a run writes.

    `entries`: the tier's checkpoints, every generation (sequences read for the complete ones);
    `resumed`: the run loaded a checkpoint, of generation `restored` (None: a copy that does not
    say, from before generations); `existing`: generations present even without a checkpoint
    (an empty `generation-<N>/`).

    - resumed: the generation of the checkpoint it loaded (a copy that does not say: the newest's
      by commit order), so the run continues where it was;
    - no complete checkpoint anywhere: the highest generation there is (0 for a new job), since
      there is nothing to keep apart from;
    - otherwise (`resume` off, or nothing could be loaded: another world size, a checksum this
      image cannot compute): a new generation, one above the highest, which deletes nothing.
    """
    entries = list(entries)
    highest = max([0, *existing, *(e.generation for e in entries)])
    newest = newest_first(entries)
    if resume and resumed:
        if restored is not None:
            return restored
        return newest[0].generation if newest else highest
    if not newest:
        return highest
    return highest + 1
