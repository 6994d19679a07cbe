"""The pure decisions of peer copies: node indices, the ring, and what a restore fetches.

No I/O here: service.py gathers the facts over the job's collectives and acts on the answers, so
every rank computes the same answer from the same gathered facts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


def node_indices(coordinator_ranks: Sequence[int]) -> dict[int, int]:
    """Global rank of each node's coordinator -> the node's index in the job.

    The index is the coordinator's place among the coordinators' global ranks. Ranks are given
    by the job's place of each pod (torchrun's group rank x local world size, JAX's process
    index), so a replacement pod gets the index of the pod it replaces, whatever its name or IP.
    """
    return {rank: i for i, rank in enumerate(sorted(set(coordinator_ranks)))}


def successor(index: int, nodes: int) -> int | None:
    """The node that keeps node `index`'s copy: the next one in ring order (None: one node)."""
    return None if nodes < 2 else (index + 1) % nodes


def predecessor(index: int, nodes: int) -> int | None:
    """The node whose copy node `index` keeps (None: one node)."""
    return None if nodes < 2 else (index - 1) % nodes


@dataclass(frozen=True)
class Holding:
    """What one node's coordinator holds at restore: its own complete local checkpoints, and the
    complete peer copies it keeps, by sender index; each step with its commit order (0: none)."""

    own: Mapping[int, int] = field(default_factory=dict)  # step -> sequence
    peers: Mapping[int, Mapping[int, int]] = field(default_factory=dict)  # sender -> step -> seq

    def to_wire(self) -> dict[str, object]:
        return {
            "own": sorted(self.own.items()),
            "peers": sorted((s, sorted(steps.items())) for s, steps in self.peers.items()),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, object]) -> Holding:
        own = {int(step): int(seq) for step, seq in data["own"]}  # type: ignore[union-attr]
        peers = {
            int(sender): {int(step): int(seq) for step, seq in steps}
            for sender, steps in data["peers"]  # type: ignore[union-attr]
        }
        return cls(own=own, peers=peers)


def plan_fetches(holdings: Mapping[int, Holding]) -> dict[int, int]:
    """Node index -> the step it fetches from its ring successor's copy.

    A node fetches step S when its own copy of S is gone, every other node has S of its own, and
    its successor keeps its copy of S: then S becomes common to every node again. Of several such
    steps, the newest by commit order (then by step). A node with nothing to fetch is absent.
    """
    nodes = len(holdings)
    if nodes < 2 or sorted(holdings) != list(range(nodes)):
        return {}
    plan: dict[int, int] = {}
    for index, mine in holdings.items():
        keeper = successor(index, nodes)
        assert keeper is not None
        kept = holdings[keeper].peers.get(index, {})
        others = [h for i, h in holdings.items() if i != index]
        usable = [
            (seq, step)
            for step, seq in kept.items()
            if step not in mine.own and all(step in h.own for h in others)
        ]
        if usable:
            plan[index] = max(usable)[1]
    return plan


def room(free_bytes: int, reserve_bytes: int) -> int:
    """Bytes a peer copy may still take: what the ramdisk has free less what the node's own next
    checkpoint needs (the size of its newest one), never below 0. The receiver's own checkpoints
    come first: a peer copy that does not fit is refused, never made room for."""
    return max(0, free_bytes - max(0, reserve_bytes))


def describe_holdings(holdings: Mapping[int, Holding], plan: Mapping[int, int]) -> str:
    """One line: each node's own steps and the copies it keeps, then what is fetched."""
    parts = []
    for index in sorted(holdings):
        h = holdings[index]
        kept = ", ".join(f"node {s}'s {sorted(steps)}" for s, steps in sorted(h.peers.items()))
        parts.append(f"node {index} has {sorted(h.own)}, keeps {kept or 'nothing'}")
    fetch = ", ".join(f"node {i} step {step}" for i, step in sorted(plan.items()))
    return "; ".join(parts) + f"; fetching {fetch or 'nothing'}"
