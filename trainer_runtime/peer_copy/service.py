"""Peer copies wired into the save protocol: `setup` and `recover` are collective (every rank
calls them at the same point, whatever fails on the way), `offer` is the coordinator's after
each local commit, and never waits.

    setup     each node's coordinator starts its server; every rank reports (rank, whether it
              coordinates, address, port, node name) with `all_gather`; global rank 0 draws the
              job's token and `broadcast`s it. Node indices follow the coordinators' ranks
              (ring.node_indices), so a replacement pod takes its predecessor's index.
    offer     after node i's local commit of step S: its Pusher sends S to node i+1 (ring order).
    recover   before restore lists candidates: the coordinators report what they hold; a node
              whose own copy of a step every other node has is gone fetches it from its ring
              successor (ring.plan_fetches), verified by content, into its own ramdisk tier. A
              fetch that fails leaves the node without that step, so restore falls back to the
              persistent tier exactly as without peer copies.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..protocol.agreement import Agreement
from ..protocol.commit import Member, describe
from ..storage import LocalTier
from .client import FETCH_PREFIX, Peer, Pusher, fetch_copy, read_own_size
from .gate import SaveGate
from .ring import Holding, describe_holdings, node_indices, plan_fetches, successor
from .server import PeerServer
from .store import PeerStore, free_bytes_of

log = logging.getLogger("trainer_runtime.peer_copy")

TIER_LABEL: Final = "local (peer copy)"  # how a restore from a peer copy names its tier


@dataclass(frozen=True)
class _Node:
    index: int
    rank: int  # its coordinator's
    peer: Peer | None  # None: its server did not start
    pod: str


class PeerCopy:
    """One process's part in the peer copies of the ramdisk tier `local`. `host`: the address
    its server listens on (the pod IP; default what the pod's hostname resolves to)."""

    def __init__(self, local: LocalTier, me: Member, host: str | None = None) -> None:
        self.local = local
        self.me = me
        self.host = host
        self.coordinator = me.local_rank == 0
        self.ready = False  # setup ran
        self.index: int | None = None  # this process's node index
        self.nodes: list[_Node] = []  # by index
        self.store: PeerStore | None = None
        self.server: PeerServer | None = None
        self.pusher: Pusher | None = None
        self.token: str | None = None
        self.fetched: dict[int, int] = {}  # node index -> step its part came from a peer copy
        # Shut while this node writes a checkpoint of its own (Checkpointer.save): the copies
        # it sends and keeps pause meanwhile.
        self.gate = SaveGate()
        # What the other nodes asked this one to keep of its own at the last commit (wanted).
        self.others_want: set[int] = set()

    # ------------------------------------------------------------------ setup

    def setup(self, io: Agreement) -> None:
        """Collective, once: servers, addresses, the token, the ring."""
        if self.ready:
            return
        self.ready = True
        port: int | None = None
        host = self.host
        if self.coordinator:
            try:
                host = host or socket.gethostbyname(socket.gethostname())
                self.server = PeerServer(None, None, host).start()
                port = self.server.port
            except Exception as e:  # this node keeps no copies; restore still works without
                log.warning("kubeckpt: peer copy server did not start: %s", describe(e))
                self.server = None
        mine = (self.me.rank, self.coordinator, host, port, self.me.node)
        try:
            gathered: list[Any] = io.all_gather(mine)
            token = io.broadcast(secrets.token_urlsafe(32) if self.me.rank == 0 else None)
        except Exception as e:  # a rank gone: the save or restore that follows says so
            log.warning("kubeckpt: peer copies off, the ranks did not agree: %s", describe(e))
            self.close()
            return
        coordinators = [g for g in gathered if g[1]]
        indices = node_indices([g[0] for g in coordinators])
        self.nodes = sorted(
            (
                _Node(indices[rank], rank, Peer(h, p) if p is not None else None, node)
                for rank, _, h, p, node in coordinators
            ),
            key=lambda n: n.index,
        )
        by_name = {n.pod: n.index for n in self.nodes}
        self.index = indices.get(self.me.rank, by_name.get(self.me.node))
        self.token = token
        if not self.coordinator or self.index is None:
            return
        after = successor(self.index, len(self.nodes))
        if after is None:
            log.info("kubeckpt: one node: the ramdisk tier has no peer to copy to")
            self.close()  # nothing to keep or serve either
            return
        if self.server is not None:
            root = Path(self.local.root)
            try:
                self.store = PeerStore(
                    root,
                    self.index,
                    len(self.nodes),
                    reserve_bytes=self.reserve_bytes,
                    free_bytes=self.free_bytes,
                    gate=self.gate,
                )
            except OSError as e:  # the ramdisk is not writable: this node keeps no copies
                log.warning("kubeckpt: cannot keep peer copies in %s: %s", root, describe(e))
                self.server.stop()
                self.server = None
            else:
                self.server.store = self.store
                self.server.token = token
        self.local.spare = self._spared  # every node: the others' copies need its own steps
        if (keeper := self.nodes[after].peer) is not None:
            self.pusher = Pusher(keeper, token, self.index, Path(self.local.root), self.gate)

    def successor_record(self) -> dict[str, Any] | None:
        """Where this node's copies go (the manifest's MANIFEST_PEER_COPY): its successor's node
        index and pod; None without one."""
        if self.index is None or self.pusher is None:
            return None
        after = successor(self.index, len(self.nodes))
        assert after is not None
        return {"node": after, "pod": self.nodes[after].pod}

    # ------------------------------------------------------------------ write

    def offer(self, step: int) -> None:
        """The node's local checkpoint of `step` is committed: copy it to the successor."""
        if self.pusher is not None:
            self.pusher.offer(step)

    def free_bytes(self) -> int:
        """The ramdisk's free space (the room for the copies received and for the spare)."""
        return free_bytes_of(self.local.root)

    def reserve_bytes(self) -> int:
        """What this node's own next checkpoint needs: never taken by a copy or a spare."""
        return read_own_size(Path(self.local.root))

    def wanted(self) -> list[int]:
        """The steps every other node should keep of its own for this node's copies: the one
        its successor accepted last and the one on its way (SpareExchange, exchanged at each
        local commit)."""
        pusher = self.pusher
        if pusher is None:
            return []
        steps = set(pusher.pushed[-1:])
        if (sending := pusher.sending) is not None:
            steps.add(sending)
        return sorted(steps)

    def asked(self, steps: set[int]) -> None:
        self.others_want = set(steps)

    def _spared(self) -> set[int]:
        """The own steps the local tier's retention keeps beyond its count: those of the copies
        other nodes have sent or are sending. Node i's copy lags its commit (it is sent after),
        and a replacement of node i can fetch its copy of step S only if every other node still
        has S of its own: without this, the commit of S+1 deleted S while node i's copy of S+1
        was still on its way, and losing node i then left nothing to resume from locally. The
        keeper knows from the copies it holds; every other node from what node i asked at the
        commit (wanted/asked), so three nodes or more are covered too. Not when the ramdisk
        would then lack room for this node's next checkpoint (its own come first), nor when the
        copies cannot be listed."""
        steps = set(self.others_want)
        try:
            if self.store is not None:
                steps |= {step for kept in self.store.holding().values() for step in kept}
            if steps and self.free_bytes() < self.reserve_bytes():
                return set()
        except OSError as e:
            log.warning("kubeckpt: cannot list the peer copies kept here: %s", describe(e))
            return set()
        return steps

    # ------------------------------------------------------------------ restore

    def recover(self, io: Agreement) -> dict[int, int]:
        """Collective: fetch the own copies that are gone from the ring successors that keep
        them (see the module docstring). Node index -> step fetched, the same on every rank."""
        report = None
        if self.coordinator and self.index is not None:
            root = Path(self.local.root)
            for leftover in root.glob(f"{FETCH_PREFIX}*"):
                shutil.rmtree(leftover, ignore_errors=True)
            try:
                own = self.local.with_sequences([e for e in self.local.scan() if e.complete])
                held = self.store.holding() if self.store is not None else {}
                holding = Holding({e.step: e.sequence or 0 for e in own if e.generation == 0}, held)
                report = (self.index, holding.to_wire())
            except Exception as e:
                log.warning("kubeckpt: cannot list the peer copies: %s", describe(e))
        gathered = [g for g in io.all_gather(report) if g is not None]
        holdings = {index: Holding.from_wire(wire) for index, wire in gathered}
        plan = plan_fetches(holdings) if len(holdings) == len(self.nodes) else {}
        if self.me.rank == 0:  # what the plan was made of: why a lost node fetched or did not
            log.info("kubeckpt: peer copies at restore: %s", describe_holdings(holdings, plan))
        fetched: int | None = None
        if self.coordinator and self.index in plan:
            step = plan[self.index]
            fetched = self._fetch(step)
        results = io.all_gather((self.index, fetched) if fetched is not None else None)
        self.fetched = {index: step for index, step in (r for r in results if r is not None)}
        return self.fetched

    def _fetch(self, step: int) -> int | None:
        after = successor(self.index, len(self.nodes)) if self.index is not None else None
        assert after is not None and self.token is not None  # a plan needs two nodes and setup
        keeper = self.nodes[after]
        if keeper.peer is None:
            return None
        into = self.local.fetch_dir(step)
        try:
            fetch_copy(keeper.peer, self.token, self.index, step, into)
        except Exception as e:  # PeerError, or a manifest of a newer format: not this copy
            log.warning(
                "kubeckpt: node %d's copy of step %d from node %d is unusable, the persistent "
                "tier remains: %s",
                self.index,
                step,
                keeper.index,
                e,
            )
            return None
        log.info("kubeckpt: fetched step %d from node %d's peer copy", step, keeper.index)
        return step

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Stop pushing and serving (idempotent)."""
        self.gate.close()  # a paused push or receive goes on to see the close
        if self.local.spare == self._spared:
            self.local.spare = None
        pusher, self.pusher = self.pusher, None
        if pusher is not None:
            pusher.close()
        server, self.server = self.server, None
        if server is not None:
            server.stop()
