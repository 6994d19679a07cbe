"""Resuming a multi-rank (DCP) checkpoint on another number of ranks: the small per-rank state.

DCP reshards model and optimizer tensors on load by itself. What it does not cover is the small
state each rank wrote next to them (`rank-<r>.state.pt`: step, epoch, RNG, scheduler, scaler,
sampler, extras, buffers): a new rank may have no file of its own, and a sampler position means
something else under another world size. `small_state` gives each new rank what it can use:

- its own state if it was a rank of the old job, else rank 0's, without RNG and buffers, which
  belong to a process that no longer exists (scheduler, scaler and extras are taken from it: they
  are the same on every rank of a data-parallel job);
- the sampler entry replaced by one built from every old rank's sampler state
  (`merge_sampler_states`), which `ResumableSampler.load_state_dict` maps to the new ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from . import plain
from .sampler import ResumableSampler

log = logging.getLogger("trainer_runtime.torch")

# Keys of a rank's state that only that rank can use.
OWN_KEYS = ("rng", "buffers")
# What must be equal in every old rank's sampler state for their positions to describe one epoch.
_COMMON = ("epoch", "seed", "num_replicas", "drop_last", "shuffle", "length", "start", "done")


def maps_world_size(sampler: Any) -> bool:
    """Whether `sampler.load_state_dict` maps a state from another world size itself."""
    return isinstance(sampler, ResumableSampler)


def read_rank_states(path: Path, world_size: int) -> list[dict[str, Any] | None]:
    """The small state of every rank of the job that wrote the checkpoint in `path`, in rank
    order; None for a rank whose file is missing."""
    states: list[dict[str, Any] | None] = []
    for rank in range(world_size):
        try:
            with open(Path(path) / plain.state_file(rank), "rb") as f:
                data = torch.load(f, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            states.append(None)
            continue
        states.append(dict(data.get("state", {})))
    return states


def merge_sampler_states(
    states: Sequence[Mapping[str, Any] | None], world_size: int | None = None
) -> dict[str, Any]:
    """One sampler state holding every old rank's position (`positions`), from the old ranks'
    states in rank order (None where a rank's state is missing).

    A missing rank is taken to be where the others are when they all agree (a step boundary); if
    they disagree there is no telling which indices it consumed: ValueError. So is a set of states
    that do not describe the same epoch of the same order.
    """
    world = len(states) if world_size is None else world_size
    present = [(r, dict(s)) for r, s in enumerate(states) if s is not None]
    if not present:
        raise ValueError("no old rank has a sampler state")
    first = present[0][1]
    first.setdefault("num_replicas", world)
    for rank, state in present[1:]:
        state.setdefault("num_replicas", world)
        for key in _COMMON:
            if _norm(state.get(key)) != _norm(first.get(key)):
                raise ValueError(
                    f"the old ranks' sampler states differ in {key!r} (rank {present[0][0]}: "
                    f"{first.get(key)!r}, rank {rank}: {state.get(key)!r}): cannot map them"
                )
    if int(first["num_replicas"]) != world:
        raise ValueError(
            f"sampler states of {first['num_replicas']} ranks in a checkpoint of {world} ranks"
        )
    positions: list[int | None] = [None] * world
    for rank, state in present:
        positions[rank] = int(state["position"])
    known = {p for p in positions if p is not None}
    if None in positions:
        missing = [r for r, p in enumerate(positions) if p is None]
        if len(known) != 1:
            raise ValueError(
                f"the sampler state of old rank(s) {missing} is missing and the others stopped "
                f"at different positions {positions}: the consumed samples are unknown"
            )
        log.warning(
            "kubeckpt: no sampler state for old rank(s) %s; taking them at position %d like the "
            "others",
            missing,
            next(iter(known)),
        )
    elif len(known) > 1:
        log.warning(
            "kubeckpt: the old ranks stopped at different sampler positions %s; mapping each",
            positions,
        )
    merged = {k: v for k, v in first.items() if k not in ("position", "rank", "consumed")}
    merged["positions"] = [next(iter(known)) if p is None else p for p in positions]
    return merged


def small_state(path: Path, world_size: int, rank: int) -> dict[str, Any]:
    """What rank `rank` of a job of another size restores from the small state of the
    `world_size` ranks that wrote the checkpoint in `path` (see the module docstring); {} when
    no rank's state is there."""
    states = read_rank_states(path, world_size)
    own = states[rank] if rank < world_size else None
    base = own if own is not None else next((s for s in states if s is not None), None)
    if base is None:
        return {}
    state = dict(base)
    if own is None:
        for key in OWN_KEYS:
            state.pop(key, None)
    samplers = [s.get("sampler") if s is not None else None for s in states]
    if any(s is not None for s in samplers):
        state["sampler"] = merge_sampler_states(samplers, world_size)
    return state


def _norm(value: Any) -> Any:
    return tuple(value) if isinstance(value, list | tuple) else value
