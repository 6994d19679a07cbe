"""A DistributedSampler that knows how far into the epoch it is, so a resume continues mid-epoch,
with the same number of ranks or another (an elastic job that changed its size)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler

# Where an epoch's iteration starts: (start, done). The sequence it serves is the epoch's order
# (the seeded permutation, or range(n) unshuffled) at the offsets `start, start+1, ..., n-1`
# except those in `done` (offsets past `start` consumed before the last change of world size, only
# ever non-empty when the old ranks stopped at different positions). (0, ()) is the whole epoch.
Plan = tuple[int, tuple[int, ...]]
FRESH: Plan = (0, ())


def shard_size(length: int, num_replicas: int, drop_last: bool) -> int:
    """How many items each rank takes when DistributedSampler splits `length` items."""
    if drop_last:
        return length // num_replicas
    return math.ceil(length / num_replicas)


def shard(length: int, num_replicas: int, rank: int, drop_last: bool) -> list[int]:
    """The positions (into a sequence of `length` items) that `rank` takes, in order, as
    DistributedSampler takes them: interleaved (rank r takes r, r+W, r+2W, ...), the sequence
    padded with its own first items up to a multiple of W (drop_last=False) or cut to one
    (drop_last=True)."""
    total = shard_size(length, num_replicas, drop_last) * num_replicas
    return [k % length for k in range(rank, total, num_replicas)]


def sequence(n: int, plan: Plan) -> list[int]:
    """The offsets into the epoch's order that an iteration with `plan` serves, in order."""
    start, done = plan
    skip = set(done)
    return [o for o in range(start, n) if o not in skip]


def advance(
    n: int, plan: Plan, num_replicas: int, positions: Sequence[int], drop_last: bool
) -> Plan:
    """The plan of what is left of the epoch after `num_replicas` ranks, each at its position
    in `positions`, iterated `plan`: consumed offsets are those the ranks handed out (a padding
    item counts as the item it repeats: a rank ahead of the others may hand it out first). When
    every rank's shard is exhausted the epoch is over, the items drop_last cut included: (n, ())."""
    if len(positions) != num_replicas:
        raise ValueError(f"{len(positions)} positions for {num_replicas} ranks")
    seq = sequence(n, plan)
    size = shard_size(len(seq), num_replicas, drop_last)
    if any(p < 0 or p > size for p in positions):
        raise ValueError(f"sampler positions {list(positions)} outside 0..{size}")
    if all(p == size for p in positions):
        return (n, ())
    consumed = {
        k % len(seq)
        for rank, p in enumerate(positions)
        for k in range(rank, p * num_replicas, num_replicas)
    }
    if len(consumed) == len(seq):  # all handed out (a rank behind would get only padding)
        return (n, ())
    first = next(k for k in range(len(seq)) if k not in consumed)
    start = seq[first]
    done = {o for o in plan[1] if o > start} | {seq[k] for k in consumed if k > first}
    return (start, tuple(sorted(done)))


def consumed_count(n: int, plan: Plan, num_replicas: int, position: int, drop_last: bool) -> int:
    """How many of the epoch's n offsets are behind a job whose every rank is at `position`
    (what a step boundary gives): n once the shards are exhausted."""
    seq_len = n - plan[0] - len(plan[1])
    if position >= shard_size(seq_len, num_replicas, drop_last):
        return n
    return n - seq_len + min(position * num_replicas, seq_len)


class ResumableSampler(DistributedSampler):
    """DistributedSampler plus `state_dict()`/`load_state_dict()` of the epoch's position, which
    `load_state_dict` maps to another number of ranks.

    `position` counts the indices this rank has handed out in the current epoch. With a DataLoader
    of `num_workers=0` that is exactly what the loop consumed at a step boundary; with worker
    processes the loader prefetches, so the position runs ahead by the batches in flight (use
    torchdata's StatefulDataLoader as a manager extra in that case). Works without
    torch.distributed: pass num_replicas=1, rank=0.

    The state: `epoch`, `seed`, `position`, and, to map it to another world size, `num_replicas`,
    `rank`, `drop_last`, `shuffle`, `length` (the dataset's), `start` and `done` (what this epoch's
    iteration serves, see `Plan`: (0, []) unless the epoch was resumed on another world size) and
    `consumed` (how many of the epoch's indices are consumed when every rank is at this position,
    for people reading it). DistributedSampler interleaves: with W ranks each at position p, the
    consumed indices are exactly the first W*p of the epoch's sequence.

    Resuming on another world size (`load_state_dict` of a state whose `num_replicas` differs from
    this sampler's, or of a state with per-rank `positions`, which `reshard.merge_sampler_states`
    builds from every old rank's state) is exact in this sense, for the epoch in progress:

    - the new ranks together serve every index of the epoch not consumed before the stop once, in
      the epoch's order (the same seeded permutation): the not-consumed rest of the sequence,
      dealt interleaved over the new ranks as DistributedSampler deals a whole epoch (new rank r
      takes items r, r+W', ...), so reading one item of every new rank in rank order, round after
      round, gives that rest in order. None is skipped, none repeated, except what
      DistributedSampler itself does when the rest does not divide by W': it pads with the rest's
      first items (drop_last=False: at most W'-1 repeats) or leaves out its last items
      (drop_last=True: at most W'-1 skipped), exactly as it does for a whole epoch;
    - epoch and seed are as saved; the next epochs are plain DistributedSampler epochs on W' ranks.

    What is not the same as an uninterrupted run: which samples make up each rank's batch and each
    step (a step now takes W' batches), hence the numeric trajectory; and (the manager's side)
    per-rank RNG streams are not restored on another world size, ranks that did not exist have no
    saved state of their own. Model, optimizer, scheduler and scaler state are restored as saved.

    If the old ranks stopped at different positions, the per-rank `positions` map exactly (the
    indices consumed past the first gap are remembered in `done`); a single state with another
    `num_replicas` means every old rank was at its position (true at a step boundary). A state
    without the keys above (written before they existed) loads as before on the same world size
    and maps as one written at `start` 0 with the same `drop_last` on another.
    """

    def __init__(self, dataset: Dataset, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.position = 0
        self._skip = 0  # set by load_state_dict: where the next iteration starts in this shard
        self._next: Plan = FRESH  # set by load_state_dict: what the next iteration serves
        self._plan: Plan = FRESH  # what the current (or last) iteration serves
        self._pending = False  # a loaded state waits for the next iteration

    def set_epoch(self, epoch: int) -> None:
        # Setting the restored epoch again keeps the resume point; another epoch starts afresh.
        if epoch != self.epoch:
            self._skip = 0
            self._next = self._plan = FRESH
            self._pending = False
            self.position = 0
        super().set_epoch(epoch)

    def _order(self) -> list[int]:
        """The epoch's order of dataset indices, as DistributedSampler draws it."""
        n = len(self.dataset)  # type: ignore[arg-type]
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def _indices(self, plan: Plan) -> list[int]:
        if plan == FRESH:
            return list(super().__iter__())
        order = self._order()
        seq = sequence(len(order), plan)
        mine = shard(len(seq), self.num_replicas, self.rank, self.drop_last)
        return [order[seq[k]] for k in mine]

    def __iter__(self) -> Iterator[int]:
        start, self._skip = self._skip, 0
        self._plan, self._next = (self._next if self._pending else FRESH), FRESH
        self._pending = False
        indices = self._indices(self._plan)
        self.position = start
        for i in range(start, len(indices)):
            self.position = i + 1
            yield indices[i]

    def state_dict(self) -> dict[str, Any]:
        plan = self._next if self._pending else self._plan
        n = len(self.dataset)  # type: ignore[arg-type]
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "length": n,
            "start": plan[0],
            "done": list(plan[1]),
            "consumed": consumed_count(n, plan, self.num_replicas, self.position, self.drop_last),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(
                f"sampler seed {self.seed} differs from the checkpoint's {state['seed']}: "
                "the data order would not match"
            )
        world = int(state.get("num_replicas", self.num_replicas))
        plan: Plan = (int(state.get("start", 0)), _offsets(state.get("done", ())))
        if "positions" in state:
            positions = [int(p) for p in state["positions"]]
        else:
            positions = [int(state["position"])] * world
        if world == self.num_replicas and len(set(positions)) == 1:
            # The same world size at one position: the same shards, continued where they were.
            position = positions[0]
        else:
            self._check_mappable(state, world)
            n = len(self.dataset)  # type: ignore[arg-type]
            drop_last = bool(state.get("drop_last", self.drop_last))
            plan = advance(n, plan, world, positions, drop_last)
            position = 0
        self.epoch = int(state["epoch"])
        self._next = plan
        self._pending = True
        self.position = self._skip = position

    def _check_mappable(self, state: Mapping[str, Any], world: int) -> None:
        n = len(self.dataset)  # type: ignore[arg-type]
        if int(state.get("length", n)) != n:
            raise ValueError(
                f"the checkpoint's sampler covered {state['length']} samples, this dataset has "
                f"{n}: its position cannot be mapped from {world} to {self.num_replicas} ranks"
            )
        if bool(state.get("shuffle", self.shuffle)) != self.shuffle:
            raise ValueError(
                f"the checkpoint's sampler had shuffle={state['shuffle']}, this one "
                f"shuffle={self.shuffle}: the data order would not match"
            )


def _offsets(values: Iterable[Any]) -> tuple[int, ...]:
    return tuple(sorted(int(v) for v in values))
