"""How a shard of a jax.Array is named on disk, shared by the snapshot and the local format (its
own module so that neither imports the other)."""

from __future__ import annotations


def shard_index(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[list[int]]:
    """A shard's index as [[start, stop], ...] (comparable across processes and runs)."""
    return [list(s.indices(n)[:2]) for s, n in zip(index, shape, strict=True)]
