"""ResumableSampler's position mapped to another world size, without processes: W samplers (one
per old rank) are iterated to their positions, their states merged as the manager does on restore,
and W' new samplers iterate the rest of the epoch.

"Exact" (ResumableSampler's docstring): the new ranks, read round-robin in rank order, serve the
not-yet-consumed rest of the epoch's order, in order, dealt as DistributedSampler deals an epoch;
with the samples consumed before the stop, every sample of the epoch is served once, except the
padding (drop_last=False) or the cut (drop_last=True) DistributedSampler itself makes when the rest
does not divide by W' (fewer than W' samples either way).
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from trainer_runtime.torch.reshard import merge_sampler_states
from trainer_runtime.torch.sampler import FRESH, ResumableSampler, advance, sequence, shard

SEED = 11


def samplers(n: int, world: int, **kw) -> list[ResumableSampler]:
    return [
        ResumableSampler(range(n), num_replicas=world, rank=r, seed=SEED, **kw)
        for r in range(world)
    ]


def take(sampler: ResumableSampler, count: int) -> list[int]:
    """Hand out `count` indices, as a DataLoader does, leaving the iteration in progress."""
    it = iter(sampler)
    out = [next(it) for _ in range(count)]
    sampler._open = it  # type: ignore[attr-defined]  # keep the generator (and position) alive
    return out


def epoch_order(n: int, epoch: int, shuffle: bool) -> list[int]:
    if not shuffle:
        return list(range(n))
    return torch.randperm(n, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def dealt(rest: list[int], world: int, drop_last: bool) -> list[list[int]]:
    """What torch's own DistributedSampler gives each of `world` ranks over `rest`, in order."""
    if not rest:
        return [[] for _ in range(world)]
    return [
        [
            rest[i]
            for i in DistributedSampler(
                range(len(rest)), num_replicas=world, rank=r, shuffle=False, drop_last=drop_last
            )
        ]
        for r in range(world)
    ]


def round_robin(per_rank: list[list[int]]) -> list[int]:
    """The global order: item k of every rank, in rank order, for k = 0, 1, ..."""
    assert len({len(x) for x in per_rank}) <= 1, "ranks must serve as many items each"
    return [x for items in zip(*per_rank, strict=True) for x in items]


def resume(old: list[ResumableSampler], n: int, new_world: int, **kw) -> list[ResumableSampler]:
    merged = merge_sampler_states([s.state_dict() for s in old])
    new = samplers(n, new_world, **kw)
    for s in new:
        s.load_state_dict(merged)
        s.set_epoch(merged["epoch"])  # what the loop does: the restored epoch keeps the position
    return new


dims = st.integers(min_value=1, max_value=6)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), world=dims, rank=st.integers(0, 5), drop=st.booleans(),
       shuffle=st.booleans(), epoch=st.integers(0, 3))  # fmt: skip
def test_fresh_epoch_is_distributed_samplers(n, world, rank, drop, shuffle, epoch) -> None:
    rank %= world
    kw = dict(num_replicas=world, rank=rank, seed=SEED, drop_last=drop, shuffle=shuffle)
    ours, theirs = ResumableSampler(range(n), **kw), DistributedSampler(range(n), **kw)
    ours.set_epoch(epoch)
    theirs.set_epoch(epoch)
    expected = list(theirs)
    assert list(ours) == expected
    # The general path (start/done) deals a fresh epoch exactly as DistributedSampler does.
    order = epoch_order(n, epoch, shuffle)
    seq = sequence(n, FRESH)
    assert [order[seq[k]] for k in shard(len(seq), world, rank, drop)] == expected


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 60), world=dims, new_world=dims, drop=st.booleans(),
       shuffle=st.booleans(), data=st.data())  # fmt: skip
def test_step_boundary_maps_exactly(n, world, new_world, drop, shuffle, data) -> None:
    old = samplers(n, world, drop_last=drop, shuffle=shuffle)
    size = len(old[0])
    p = data.draw(st.integers(0, size), label="position")
    for s in old:
        s.set_epoch(2)
    before = [take(s, p) for s in old]
    order = epoch_order(n, 2, shuffle)
    consumed = round_robin(before)
    if p < size:
        assert consumed == order[: world * p]  # the interleaving: a prefix of the order
    assert all(s.state_dict()["consumed"] == (n if p == size else world * p) for s in old)

    new = resume(old, n, new_world, drop_last=drop, shuffle=shuffle)
    after = [list(s) for s in new]
    rest = [] if p == size else order[world * p :]
    if new_world == world:  # the same shards, continued: what an uninterrupted run serves
        assert after == [full[p:] for full in dealt(order, world, drop)]
    else:  # the rest, dealt as DistributedSampler deals an epoch
        assert after == dealt(rest, new_world, drop)
    # Every sample of the epoch once, but for DistributedSampler's own padding or cut.
    served = Counter(consumed) + Counter(round_robin(after))
    repeated = sum(c - 1 for c in served.values())
    missing = set(order) - set(served)
    slack = (world - 1 if p == size else 0) + new_world - 1
    if drop:
        assert repeated == 0 and len(missing) <= slack
        if p < size and len(rest) % new_world == 0:
            assert not missing
    else:
        assert not missing and repeated <= (world - 1 if p == size else 0) + new_world - 1
        if p < size and len(rest) % new_world == 0:
            assert repeated == 0

    # The next epoch is a plain DistributedSampler epoch on the new ranks.
    for r, s in enumerate(new):
        s.set_epoch(3)
        ref = DistributedSampler(range(n), num_replicas=new_world, rank=r, seed=SEED,
                                 drop_last=drop, shuffle=shuffle)  # fmt: skip
        ref.set_epoch(3)
        assert list(s) == list(ref)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 50), worlds=st.lists(dims, min_size=2, max_size=4), data=st.data())
def test_chain_of_resizes_and_uneven_positions(n, worlds, data) -> None:
    """Resized several times within one epoch, the ranks stopping at any positions (not only a
    step boundary): all samples served once in total, no sample twice (drop_last=False with a
    rest that divides, else only the padding)."""
    served: list[int] = []
    current = samplers(n, worlds[0])
    for s in current:
        s.set_epoch(1)
    for new_world in worlds[1:]:
        left = [len(s._indices(s._next if s._pending else FRESH)) - s._skip for s in current]
        positions = [data.draw(st.integers(0, k)) for k in left]
        for s, p in zip(current, positions, strict=True):
            served += take(s, p)
        current = resume(current, n, new_world)
    seq_left = [i for s in current for i in list(s)]
    total = Counter(served) + Counter(seq_left)
    assert set(total) == set(range(n)), "a sample was skipped"
    unique_rest = n - len(set(served))
    pads = sum(c - 1 for c in total.values())
    # Padding only: fewer than W' per resize at most (one per resize's rest, and the first run's).
    assert pads <= sum(w - 1 for w in worlds)
    if unique_rest % worlds[-1] == 0 and len(served) == len(set(served)):
        assert pads == 0


def test_uneven_positions_exact() -> None:
    n = 20
    old = samplers(n, 2)
    for s in old:
        s.set_epoch(0)
    a, b = take(old[0], 5), take(old[1], 2)  # rank 0 ran ahead
    new = resume(old, n, 3)
    rest = [i for i in epoch_order(n, 0, True) if i not in set(a + b)]
    assert round_robin([list(s) for s in new])[: len(rest)] == rest


def test_same_world_size_continues_the_same_shards() -> None:
    n, world = 37, 3
    old = samplers(n, world)
    for s in old:
        s.set_epoch(4)
    for s in old:
        take(s, 5)
    for r, s in enumerate(old):
        fresh = ResumableSampler(range(n), num_replicas=world, rank=r, seed=SEED)
        fresh.load_state_dict(s.state_dict())
        fresh.set_epoch(4)
        ref = DistributedSampler(range(n), num_replicas=world, rank=r, seed=SEED)
        ref.set_epoch(4)
        assert list(fresh) == list(ref)[5:]


def test_legacy_state_loads() -> None:
    """A state written before the mapping keys existed (epoch, position, seed)."""
    n = 32  # the rest (24) divides by 3: no padding
    s = ResumableSampler(range(n), num_replicas=2, rank=1, seed=SEED)
    s.load_state_dict({"epoch": 1, "position": 4, "seed": SEED})
    ref = DistributedSampler(range(n), num_replicas=2, rank=1, seed=SEED)
    ref.set_epoch(1)
    assert s.epoch == 1 and list(s) == list(ref)[4:]
    # ... and maps to another world size like a state of `start` 0 (merged with the manager's
    # world size: every old rank at position 4).
    merged = merge_sampler_states([{"epoch": 1, "position": 4, "seed": SEED}] * 2)
    new = samplers(n, 3)
    for t in new:
        t.load_state_dict(merged)
    assert round_robin([list(t) for t in new]) == epoch_order(n, 1, True)[8:]


def test_state_right_after_restore_round_trips() -> None:
    """A save before the loader ran (stop during warm-up) keeps the mapped position."""
    n = 40
    old = samplers(n, 2)
    for s in old:
        s.set_epoch(0)
        take(s, 6)
    new = resume(old, n, 4)
    again = samplers(n, 4)
    for s, t in zip(new, again, strict=True):
        t.load_state_dict(s.state_dict())
        t.set_epoch(0)
    served = [list(t) for t in again]
    assert served == [list(s) for s in new]
    assert round_robin(served) == epoch_order(n, 0, True)[12:]


def test_new_epoch_after_load_starts_afresh() -> None:
    s = ResumableSampler(range(10), num_replicas=1, rank=0, seed=SEED)
    s.load_state_dict({"epoch": 0, "position": 3, "seed": SEED, "num_replicas": 2})
    s.set_epoch(1)
    assert list(s) == epoch_order(10, 1, True)
    assert s.state_dict()["start"] == 0 and s.state_dict()["position"] == 10


def test_errors() -> None:
    s = ResumableSampler(range(10), num_replicas=2, rank=0, seed=SEED)
    with pytest.raises(ValueError, match="seed"):
        s.load_state_dict({"epoch": 0, "position": 1, "seed": SEED + 1})
    with pytest.raises(ValueError, match="12 samples"):
        s.load_state_dict({"epoch": 0, "position": 1, "seed": SEED, "num_replicas": 3,
                           "length": 12})  # fmt: skip
    with pytest.raises(ValueError, match="shuffle"):
        s.load_state_dict({"epoch": 0, "position": 1, "seed": SEED, "num_replicas": 3,
                           "shuffle": False})  # fmt: skip
    with pytest.raises(ValueError, match="positions"):
        advance(10, FRESH, 2, [1], False)
    with pytest.raises(ValueError, match="outside"):
        advance(10, FRESH, 2, [1, 6], False)


def test_merge_missing_rank(caplog: pytest.LogCaptureFixture) -> None:
    state = {"epoch": 0, "position": 3, "seed": SEED, "num_replicas": 3}
    with caplog.at_level(logging.WARNING):
        merged = merge_sampler_states([state, None, state])
    assert merged["positions"] == [3, 3, 3] and "old rank(s) [1]" in caplog.text
    with pytest.raises(ValueError, match="consumed samples are unknown"):
        merge_sampler_states([state, None, {**state, "position": 4}])
    with pytest.raises(ValueError, match="differ in 'epoch'"):
        merge_sampler_states([state, {**state, "epoch": 1}, state])
    with pytest.raises(ValueError, match="no old rank"):
        merge_sampler_states([None, None])
