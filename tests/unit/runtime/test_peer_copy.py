"""Peer copies of the ramdisk tier on loopback (trainer_runtime/peer_copy/): a receiver's store
and server, a sender's push and a restore's fetch, over real HTTP between temp "ramdisks"; the
hostile requests a receiver refuses; and a restore of N simulated ranks (threads, toy framework)
whose node lost its ramdisk."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.simulated_ranks import SimulatedAgreement, SimulatedGroup, run_ranks
from tests.support.toy_ranks import Job, ToyLoader, ToySave
from tests.support.toy_ranks import _env as _toy_env
from trainer_runtime import layout
from trainer_runtime.config import Config
from trainer_runtime.contract import (
    MANIFEST_FILE,
    MANIFEST_PEER_COPY,
    RESUMED_TIER,
    ContractError,
    build_manifest,
    read_manifest,
    write_manifest_atomic,
)
from trainer_runtime.fsutil import PEER_COPY_NICE
from trainer_runtime.peer_copy.client import (
    Peer,
    PeerError,
    Pusher,
    fetch_copy,
    push_copy,
    read_own_size,
)
from trainer_runtime.peer_copy.gate import SaveGate
from trainer_runtime.peer_copy.server import MAX_CONNECTIONS, PeerServer
from trainer_runtime.peer_copy.service import TIER_LABEL, PeerCopy
from trainer_runtime.peer_copy.store import PeerStore
from trainer_runtime.protocol import Checkpointer, Member, Solo
from trainer_runtime.protocol.commit import Report, TierCommit
from trainer_runtime.storage import LocalTier

TOKEN = "job-token"


def _checkpoint(root: Path, step: int, files: dict[str, bytes], sequence: int = 1) -> Path:
    """A complete local checkpoint of one node, as TierCommit leaves it."""
    path = layout.checkpoint_path(root, step)
    path.mkdir(parents=True)
    for rel, data in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    manifest = build_manifest(
        path,
        step=step,
        epoch=0,
        world_size=2,
        framework="toy",
        tier="local",
        extra={"sequence": sequence},
    )
    write_manifest_atomic(path, manifest)
    return path


class _Receiver:
    """Node `index` of `nodes`: its ramdisk, store and server on loopback."""

    def __init__(self, ramdisk: Path, index: int, nodes: int, free: int | None = None) -> None:
        self.ramdisk = ramdisk
        self.store = PeerStore(
            ramdisk,
            index,
            nodes,
            reserve_bytes=lambda: 0,
            free_bytes=None if free is None else (lambda: free),
        )
        self.server = PeerServer(self.store, TOKEN, "127.0.0.1").start()
        self.peer = Peer("127.0.0.1", self.server.port)

    def kept(self) -> list[str]:
        """Everything under the receiver's peers/ directory (relative paths)."""
        root = self.store.root
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Any]:
    made: list[_Receiver] = []

    def make(index: int = 1, nodes: int = 2, free: int | None = None) -> _Receiver:
        made.append(_Receiver(tmp_path / f"ramdisk-{index}", index, nodes, free))
        return made[-1]

    yield make
    for r in made:
        r.server.stop()


def _wait_sending(pusher: Pusher, step: int, timeout: float = 10) -> None:
    """Until `pusher` has taken the offer of `step` (its push under way); fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while pusher.sending != step and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pusher.sending == step, (pusher.sending, step)


def _raw(peer: Peer, method: str, path: str, body: bytes = b"", **headers: str) -> tuple[int, str]:
    conn = peer.connect()
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_a_copy_arrives_complete_and_a_newer_one_replaces_it(receiver, tmp_path: Path) -> None:
    r = receiver()
    src = tmp_path / "ramdisk-0"
    files = {"rank-0.bin": os.urandom(3 * 1024 * 1024 + 7), "sub/rank-1.bin": b"x" * 10}
    five = _checkpoint(src, 5, files, sequence=1)
    sent = push_copy(r.peer, TOKEN, 0, 5, five)
    assert sent > sum(len(b) for b in files.values())  # the files, then the manifest
    copy = r.store.complete_dir(0, 5)
    assert {rel: (copy / rel).read_bytes() for rel in files} == files
    assert read_manifest(copy) == read_manifest(five)
    assert r.store.holding() == {0: {5: 1}}
    seven = _checkpoint(src, 7, {"rank-0.bin": b"newer"}, sequence=2)
    push_copy(r.peer, TOKEN, 0, 7, seven)
    assert r.store.holding() == {0: {7: 2}}  # only the newest complete copy per sender
    assert r.kept() == [
        "0",
        "0/checkpoint-7",
        "0/checkpoint-7/manifest.json",
        "0/checkpoint-7/rank-0.bin",
    ]


def test_without_the_token_nothing_is_stored_or_served(receiver, tmp_path: Path) -> None:
    r = receiver()
    five = _checkpoint(tmp_path / "ramdisk-0", 5, {"rank-0.bin": b"state"})
    with pytest.raises(PeerError, match="401"):
        push_copy(r.peer, "wrong-token", 0, 5, five)
    assert r.kept() == []
    push_copy(r.peer, TOKEN, 0, 5, five)
    status, _ = _raw(r.peer, "GET", "/peer/v1/0/5/files/rank-0.bin")  # no Authorization
    assert status == 401
    status, _ = _raw(r.peer, "GET", "/peer/v1/0/5/manifest", Authorization="Bearer job-toke")
    assert status == 401
    assert r.store.refused == 3


def test_connections_past_the_bound_are_closed_and_the_job_still_gets_through(
    receiver, tmp_path: Path
) -> None:
    """Anything on the pod network may connect: idle connections (no token, no request) hold
    at most MAX_CONNECTIONS threads; one more is closed at once, and once they go, the job's
    own push is served."""
    r = receiver()
    idle = [socket.create_connection(("127.0.0.1", r.server.port)) for _ in range(MAX_CONNECTIONS)]
    try:
        extra = socket.create_connection(("127.0.0.1", r.server.port))
        extra.settimeout(5)
        try:
            assert extra.recv(1) == b""  # closed by the server, not left waiting
        except ConnectionResetError:
            pass
        finally:
            extra.close()
        assert r.server.refused_connections >= 1
    finally:
        for s in idle:
            s.close()
    five = _checkpoint(tmp_path / "ramdisk-0", 5, {"rank-0.bin": b"state"})
    deadline = time.monotonic() + 10
    while True:  # the idle connections' threads end as their sockets close
        try:
            push_copy(r.peer, TOKEN, 0, 5, five)
            break
        except PeerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert r.store.holding() == {0: {5: 1}}


def test_only_the_ring_predecessor_may_store_a_copy(receiver, tmp_path: Path) -> None:
    r = receiver(index=1, nodes=3)  # keeps node 0's copies, nobody else's
    two = _checkpoint(tmp_path / "ramdisk-2", 5, {"rank-2.bin": b"state"})
    with pytest.raises(PeerError, match="403"):
        push_copy(r.peer, TOKEN, 2, 5, two)
    assert r.kept() == []


@pytest.mark.parametrize(
    "path",
    [
        "..%2F..%2Fescaped.bin",  # .. out of the copy
        "%2Fetc%2Fescaped.bin",  # absolute
        "a%2F..%2F..%2Fescaped.bin",
        "manifest.json",  # the commit marker is not a file of the copy
    ],
)
def test_a_path_that_escapes_is_refused_and_leaves_nothing(
    receiver, tmp_path: Path, path: str
) -> None:
    r = receiver()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, reason = _raw(r.peer, "PUT", f"/peer/v1/0/5/files/{path}", b"evil", **auth)
    assert status == 400, reason
    assert r.kept() == []
    assert not list(tmp_path.rglob("escaped.bin"))


def test_a_file_is_never_written_through_a_symlink(receiver, tmp_path: Path) -> None:
    r = receiver()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    outside = tmp_path / "outside"
    outside.mkdir()
    for link, to in (("out", outside), ("in", Path("real"))):
        for rel in (f"{link}/evil.bin", f"{link}/sub/evil.bin"):
            assert _raw(r.peer, "PUT", "/peer/v1/0/5/files/real/1.bin", b"1", **auth)[0] == 201
            (r.store.partial_dir(0, 5) / link).symlink_to(to)  # planted by a local attacker
            status, reason = _raw(r.peer, "PUT", f"/peer/v1/0/5/files/{rel}", b"e", **auth)
            assert status == 400 and "a symlink on the way" in reason, reason
            assert list(outside.iterdir()) == []  # not even a directory made through it
            assert r.kept() == ["0"]  # the refusal dropped the copy in progress


def test_a_symlink_in_a_kept_copy_is_never_followed(receiver, tmp_path: Path) -> None:
    r = receiver()
    five = _checkpoint(tmp_path / "ramdisk-0", 5, {"rank-0.bin": b"state"})
    push_copy(r.peer, TOKEN, 0, 5, five)
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    target = r.store.complete_dir(0, 5) / "rank-0.bin"
    target.unlink()
    target.symlink_to(secret)
    status, _ = _raw(
        r.peer, "GET", "/peer/v1/0/5/files/rank-0.bin", Authorization=f"Bearer {TOKEN}"
    )
    assert status == 404


def test_a_copy_larger_than_the_room_is_refused_and_counted(receiver, tmp_path: Path) -> None:
    r = receiver(free=1000)
    five = _checkpoint(tmp_path / "ramdisk-0", 5, {"a.bin": b"1" * 600, "b.bin": b"2" * 1200})
    with pytest.raises(PeerError, match="413"):
        push_copy(r.peer, TOKEN, 0, 5, five)
    assert r.kept() == ["0"]  # the partial copy went with the refusal
    assert r.store.refused_for_room == 1


def test_the_nodes_own_next_checkpoint_keeps_its_room(tmp_path: Path) -> None:
    ramdisk = tmp_path / "ramdisk-1"
    own = _checkpoint(ramdisk, 9, {"rank-1.bin": b"o" * 800})
    store = PeerStore(ramdisk, 1, 2, reserve_bytes=lambda: 800, free_bytes=lambda: 1000)
    server = PeerServer(store, TOKEN, "127.0.0.1").start()
    try:
        five = _checkpoint(tmp_path / "ramdisk-0", 5, {"rank-0.bin": b"p" * 500})
        with pytest.raises(PeerError, match="413"):
            push_copy(Peer("127.0.0.1", server.port), TOKEN, 0, 5, five)
    finally:
        server.stop()
    assert layout.verify_checkpoint(own, checksums=True)[1] == []  # never evicted
    assert store.holding() == {}


def test_a_body_shorter_than_declared_leaves_nothing(receiver, caplog) -> None:
    """A sender that stops mid-file (its pod ending) leaves nothing; the keeper says so as
    information, not as a refused request."""
    r = receiver()
    with caplog.at_level("INFO", logger="trainer_runtime.peer_copy"):
        with socket.create_connection(("127.0.0.1", r.server.port)) as s:
            s.sendall(
                b"PUT /peer/v1/0/5/files/rank-0.bin HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode()
                + b"only ten b"
            )
            s.shutdown(socket.SHUT_WR)
            answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert r.kept() == ["0"]
    assert (r.store.interrupted, r.store.refused) == (1, 0)
    cut = [rec for rec in caplog.records if "cut short" in rec.getMessage()]
    assert [rec.levelname for rec in cut] == ["INFO"], caplog.text
    assert "step 5" in cut[0].getMessage() and "90 bytes short" in cut[0].getMessage()
    assert not [rec for rec in caplog.records if rec.levelname == "WARNING"], caplog.text


def test_a_body_longer_than_declared_is_not_stored_past_its_length(receiver, tmp_path) -> None:
    r = receiver()
    five = _checkpoint(tmp_path / "ramdisk-0", 5, {"rank-0.bin": b"0123456789" * 2})
    with socket.create_connection(("127.0.0.1", r.server.port)) as s:
        s.sendall(
            b"PUT /peer/v1/0/5/files/rank-0.bin HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 10\r\n\r\n".encode()
            + b"0123456789" * 2
        )
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 201"), answer
    # The manifest lists 20 bytes; 10 were declared and kept: the copy never completes.
    status, reason = _raw(
        r.peer,
        "PUT",
        "/peer/v1/0/5/manifest",
        (five / MANIFEST_FILE).read_bytes(),
        Authorization=f"Bearer {TOKEN}",
    )
    assert status == 422 and "size mismatch" in reason
    assert r.kept() == ["0"]


def test_a_manifest_that_does_not_match_the_files_is_refused(receiver, tmp_path: Path) -> None:
    r = receiver()
    src = tmp_path / "ramdisk-0"
    five = _checkpoint(src, 5, {"rank-0.bin": b"good state"})
    auth = f"Bearer {TOKEN}"
    status, _ = _raw(
        r.peer, "PUT", "/peer/v1/0/5/files/rank-0.bin", b"evil state", Authorization=auth
    )
    assert status == 201  # same size, other content: the manifest's checksum tells
    status, reason = _raw(
        r.peer,
        "PUT",
        "/peer/v1/0/5/manifest",
        (five / MANIFEST_FILE).read_bytes(),
        Authorization=auth,
    )
    assert status == 422 and "checksum mismatch" in reason
    assert r.kept() == ["0"]
    # A file the manifest does not list, or one it lists that never came, is refused too.
    for extra in ("rank-0.bin", "stowaway.bin"):
        _raw(r.peer, "PUT", f"/peer/v1/0/5/files/{extra}", b"good state", Authorization=auth)
    status, reason = _raw(
        r.peer,
        "PUT",
        "/peer/v1/0/5/manifest",
        (five / MANIFEST_FILE).read_bytes(),
        Authorization=auth,
    )
    assert status == 422 and "not in the manifest: stowaway.bin" in reason
    assert r.kept() == ["0"]
    status, reason = _raw(r.peer, "PUT", "/peer/v1/0/5/manifest", b"{not json", Authorization=auth)
    assert status == 400 and r.kept() == ["0"]


def test_fetch_verifies_by_content_and_a_corrupt_copy_leaves_nothing(
    receiver, tmp_path: Path
) -> None:
    r = receiver()
    files = {"rank-0.bin": os.urandom(4096)}
    five = _checkpoint(tmp_path / "ramdisk-0", 5, files)
    push_copy(r.peer, TOKEN, 0, 5, five)
    into = tmp_path / "replacement" / "checkpoint-5"
    into.parent.mkdir()
    assert fetch_copy(r.peer, TOKEN, 0, 5, into) == into
    assert (into / "rank-0.bin").read_bytes() == files["rank-0.bin"]
    shutil.rmtree(into)
    kept = r.store.complete_dir(0, 5) / "rank-0.bin"
    kept.write_bytes(bytes(b ^ 1 for b in files["rank-0.bin"]))  # same size, other bytes
    with pytest.raises(PeerError, match="does not verify"):
        fetch_copy(r.peer, TOKEN, 0, 5, into)
    assert list(into.parent.iterdir()) == []
    with pytest.raises(PeerError, match="404"):
        fetch_copy(r.peer, TOKEN, 0, 6, into)  # a copy it does not keep
    assert list(into.parent.iterdir()) == []


def test_the_pusher_sends_the_newest_offer_and_never_blocks(receiver, tmp_path: Path) -> None:
    r = receiver()
    src = tmp_path / "ramdisk-0"
    for step in (1, 2, 3):
        _checkpoint(src, step, {"rank-0.bin": os.urandom(1024)}, sequence=step)
    pusher = Pusher(r.peer, TOKEN, 0, src)
    try:
        started = time.monotonic()
        for step in (1, 2, 3):
            pusher.offer(step)
        assert time.monotonic() - started < 0.5
        assert pusher.wait_idle(30)
    finally:
        pusher.close()
    assert pusher.pushed[-1] == 3 and r.store.holding() == {0: {3: 3}}


@pytest.mark.parametrize("removed", ["checkpoint-1", "checkpoint-1/rank-0.bin"])
def test_a_step_retention_removed_before_its_push_is_skipped_not_failed(
    receiver, tmp_path: Path, caplog, removed: str
) -> None:
    """The commit of step S+1 removes S while S's offer is about to be taken (S+1's offer comes
    right after): S is skipped quietly, and S+1 is sent. Gone whole, or its files first (the
    manifest still there)."""
    r = receiver()
    src = tmp_path / "ramdisk-0"
    for step in (1, 2):
        _checkpoint(src, step, {"rank-0.bin": os.urandom(1024)}, sequence=step)
    gone = src / removed
    if gone.is_dir():
        shutil.rmtree(gone)
    else:
        gone.unlink()
    pusher = Pusher(r.peer, TOKEN, 0, src)
    try:
        with caplog.at_level("INFO", logger="trainer_runtime.peer_copy"):
            pusher.offer(1)
            assert pusher.wait_idle(30)
            pusher.offer(2)
            assert pusher.wait_idle(30)
    finally:
        pusher.close()
    assert (pusher.skipped, pusher.failures, pusher.pushed) == (1, 0, [2])
    assert not [rec for rec in caplog.records if rec.levelname == "WARNING"], caplog.text
    assert "peer copy skipped: step 1: no longer in the ramdisk" in caplog.text
    assert r.store.holding() == {0: {2: 2}}


# ---------------------------------------------------------------- a job of simulated ranks


def _peer_job(job_factory, tmp_path: Path, n: int) -> Job:
    j = job_factory(n, CHECKPOINT_LOCAL_DIR="", CHECKPOINT_LOCAL_PERIOD="1")
    for r, c in enumerate(j.ckpts):  # a ramdisk per node; each rank is a node's coordinator
        c.local = type(c.persistent)(str(tmp_path / f"ramdisk-{r}"), "local")
        c.schedule.local_enabled = True
        c.peer = PeerCopy(c.local, c.me, "127.0.0.1")
    return j


def _train_and_copy(job, tmp_path: Path, n: int, steps: range) -> None:
    j = _peer_job(job, tmp_path, n)

    def rank(r: int) -> None:
        c = j.ckpts[r]
        for step in steps:
            c.observe(step)
            d = c.decide(step)
            if d.persistent or d.local:
                c.save(
                    step, lambda s=step: ToySave(r, [s, r]), persistent=d.persistent, local=d.local
                )
        c.session.wait()  # the last save's result offers its local checkpoint to the pusher
        assert c.peer is not None and c.peer.pusher is not None
        assert c.peer.pusher.wait_idle(30)
        c.close()

    run_ranks(n, rank)


def test_a_replaced_node_restores_from_its_successors_copy(job, tmp_path: Path) -> None:
    _train_and_copy(job, tmp_path, 2, range(1, 4))
    assert [e.step for e in layout.scan(tmp_path / "ckpt")] == [2]
    lost = tmp_path / "ramdisk-1" / "checkpoint-3"
    before = (lost / "rank-1.json").read_bytes()
    manifest = read_manifest(lost)
    assert manifest.extra[MANIFEST_PEER_COPY] == {"node": 0, "pod": "node-0"}
    kept = tmp_path / "ramdisk-0" / "peers" / "1" / "checkpoint-3"
    assert (kept / "rank-1.json").read_bytes() == before
    shutil.rmtree(tmp_path / "ramdisk-1")  # node 1 was replaced: a new, empty ramdisk
    k = _peer_job(job, tmp_path, 2)
    restored = run_ranks(2, lambda r: k.ckpts[r].restore(ToyLoader(r)))
    assert [(x.step, x.tier.name) for x in restored] == [(3, "local")] * 2
    assert [c.resumed_tier for c in k.ckpts] == [TIER_LABEL] * 2
    assert k.ckpts[0].progress.checkpointing.extra[RESUMED_TIER] == TIER_LABEL  # the record says so
    assert (lost / "rank-1.json").read_bytes() == before  # bitwise
    assert read_manifest(lost) == manifest
    # A node that lost nothing, and the copies each keeps, are left as they were.
    assert (kept / "rank-1.json").read_bytes() == before


def test_a_copy_still_on_its_way_keeps_the_step_it_replaces_restorable(job, tmp_path: Path) -> None:
    """Node 1's copy of step 3 never arrives (as when node 1 dies while sending it): node 0 keeps
    node 1's copy of step 2, so its retention keeps its own step 2 beside 3 (one is its count),
    and a replacement of node 1 resumes at step 2 from the ramdisks, not from the persistent tier.
    Without the spare, node 0 held only its own step 3 and the copy of 2 was useless."""
    j = _peer_job(job, tmp_path, 2)

    def rank(r: int) -> None:
        c = j.ckpts[r]
        assert c.peer is not None
        for step in (1, 2, 3):
            if step == 3:
                c.session.wait()
                assert c.peer.pusher is not None and c.peer.pusher.wait_idle(30)
                c.io.barrier()  # both copies of step 2 are kept before either commits 3
                if r == 1:  # its copy of step 3 goes nowhere
                    c.peer.pusher.close()
                    c.peer.pusher = None
            d = c.decide(step)
            c.save(step, lambda s=step: ToySave(r, [s, r]), persistent=d.persistent, local=d.local)
        c.session.wait()
        c.close()

    run_ranks(2, rank)
    assert sorted(p.name for p in (tmp_path / "ramdisk-0" / "peers" / "1").iterdir()) == [
        "checkpoint-2"
    ]
    assert sorted(e.step for e in layout.scan(tmp_path / "ramdisk-0")) == [2, 3]
    shutil.rmtree(tmp_path / "ramdisk-1")
    k = _peer_job(job, tmp_path, 2)
    restored = run_ranks(2, lambda r: k.ckpts[r].restore(ToyLoader(r)))
    assert [(x.step, x.tier.name) for x in restored] == [(2, "local")] * 2
    assert [c.resumed_tier for c in k.ckpts] == [TIER_LABEL] * 2


def test_with_three_nodes_every_node_keeps_the_step_a_lagging_copy_is_of(
    job, tmp_path: Path
) -> None:
    """Node 1's copies stop arriving after step 1 (its keeper, node 2, stops receiving). Node 0
    keeps no copy of node 1's, so only node 1 knows its copy is of step 1: it asks at each local
    commit, and node 0 keeps its own step 1 beside 2 and 3 (its count is 1). A replacement of
    node 1 then resumes at step 1 from the ramdisks. Without the ask, node 0 deleted its step 1
    at the commit of 3 and the replacement had no checkpoint at all to resume from."""
    j = _peer_job(job, tmp_path, 3)

    def rank(r: int) -> None:
        c = j.ckpts[r]
        assert c.peer is not None
        for step in (1, 2, 3):
            if step > 1:
                c.session.wait()
                assert c.peer.pusher is not None and c.peer.pusher.wait_idle(30)
                c.io.barrier()  # every copy of the step before is where it will stay
                if step == 2 and r == 2:
                    assert c.peer.server is not None
                    c.peer.server.stop()  # node 1's copies of 2 and 3 go nowhere
            c.save(step, lambda s=step: ToySave(r, [s, r]), persistent=False, local=True)
        c.session.wait()
        c.close()

    run_ranks(3, rank)
    # At the commit of 3: node 1's copy was last accepted at 1, nodes 0's and 2's at 2.
    assert j.ckpts[0].peer is not None and j.ckpts[0].peer.others_want == {1, 2}
    assert sorted(e.step for e in layout.scan(tmp_path / "ramdisk-0")) == [1, 2, 3]
    assert sorted(e.step for e in layout.scan(tmp_path / "ramdisk-2")) == [1, 2, 3]
    shutil.rmtree(tmp_path / "ramdisk-1")
    k = _peer_job(job, tmp_path, 3)
    loaders = [ToyLoader(r) for r in range(3)]
    restored = run_ranks(3, lambda r: k.ckpts[r].restore(loaders[r]))
    assert [(x.step, x.tier.name) for x in restored] == [(1, "local")] * 3
    assert [c.resumed_tier for c in k.ckpts] == [TIER_LABEL] * 3
    assert [ld.loaded for ld in loaders] == [[1, 0], [1, 1], [1, 2]]


def test_the_spare_gives_way_when_the_next_own_checkpoint_would_not_fit(
    job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's own checkpoints come first: with less room left than its newest checkpoint's
    size, retention keeps its count only, whatever copies it keeps."""
    j = _peer_job(job, tmp_path, 2)
    run_ranks(2, lambda r: j.ckpts[r].peer.setup(j.ckpts[r].io))  # type: ignore[union-attr]
    peer = j.ckpts[0].peer
    assert peer is not None and peer.store is not None
    _checkpoint(tmp_path / "ramdisk-0", 5, {"rank-0.json": b"x" * 100})
    _checkpoint(peer.store.root / "1", 4, {"rank-1.json": b"y" * 100})
    assert j.ckpts[0].local.spare is not None and j.ckpts[0].local.spare() == {4}
    # Less room than the newest own checkpoint's 100 bytes (and its manifest).
    monkeypatch.setattr(peer, "free_bytes", lambda: 99)
    assert j.ckpts[0].local.spare() == set()
    for c in j.ckpts:
        c.close()
    assert j.ckpts[0].local.spare is None  # closed: retention as without peer copies


def test_a_corrupt_peer_copy_is_rejected_and_the_restore_falls_back(job, tmp_path: Path) -> None:
    _train_and_copy(job, tmp_path, 2, range(1, 4))
    kept = tmp_path / "ramdisk-0" / "peers" / "1" / "checkpoint-3" / "rank-1.json"
    kept.write_bytes(kept.read_bytes().replace(b"3", b"4"))  # same size, other state
    shutil.rmtree(tmp_path / "ramdisk-1")
    k = _peer_job(job, tmp_path, 2)
    loaders = [ToyLoader(r) for r in range(2)]
    restored = run_ranks(2, lambda r: k.ckpts[r].restore(loaders[r]))
    assert [(x.step, x.tier.name) for x in restored] == [(2, "persistent")] * 2
    assert [c.resumed_tier for c in k.ckpts] == ["persistent"] * 2
    assert [ld.loaded for ld in loaders] == [[2, 0], [2, 1]]
    assert not (tmp_path / "ramdisk-1" / "checkpoint-3").exists()  # nothing unverified kept


def test_three_nodes_copy_round_the_ring(job, tmp_path: Path) -> None:
    _train_and_copy(job, tmp_path, 3, range(1, 4))
    for node in range(3):
        keeper = (node + 1) % 3
        kept = tmp_path / f"ramdisk-{keeper}" / "peers" / str(node)
        assert [p.name for p in kept.iterdir()] == ["checkpoint-3"]
        mine = tmp_path / f"ramdisk-{node}" / "checkpoint-3" / f"rank-{node}.json"
        assert (kept / "checkpoint-3" / f"rank-{node}.json").read_bytes() == mine.read_bytes()
    assert json.loads((tmp_path / "ramdisk-2" / "checkpoint-3" / "rank-2.json").read_text()) == [
        3,
        2,
    ]


def test_one_node_has_no_peer_and_saves_as_before(job, tmp_path: Path) -> None:
    j = _peer_job(job, tmp_path, 1)
    c = j.ckpts[0]
    c.save(1, lambda: ToySave(0, [1, 0]), persistent=False, local=True, blocking=True)
    assert c.peer is not None and c.peer.pusher is None and c.peer.successor_record() is None
    assert c.peer.server is None  # nothing to keep or serve: no port left open
    assert MANIFEST_PEER_COPY not in read_manifest(tmp_path / "ramdisk-0" / "checkpoint-1").extra
    c.close()


def test_the_environment_turns_peer_copies_on_with_the_local_tier(tmp_path: Path) -> None:
    base = _toy_env(tmp_path, 0, CHECKPOINT_LOCAL_PEER="1", KUBECKPT_POD_IP="10.0.0.7")

    def made(**env: str) -> Checkpointer:
        config = Config.from_env({**base, **env})
        return Checkpointer(config, framework="toy", comm=Solo(), io=Solo(), me=Member())

    on = made(CHECKPOINT_LOCAL_DIR=str(tmp_path / "ramdisk"))
    assert on.peer is not None and on.peer.host == "10.0.0.7" and on.peer.local is on.local
    assert made().peer is None  # no local tier: nothing to copy
    assert made(CHECKPOINT_LOCAL_DIR=str(tmp_path / "r"), CHECKPOINT_LOCAL_PEER="no").peer is None
    with pytest.raises(ContractError, match="CHECKPOINT_LOCAL_PEER"):
        made(CHECKPOINT_LOCAL_PEER="sometimes")


def test_setup_with_a_rank_gone_leaves_peer_copies_off_without_raising(tmp_path: Path) -> None:
    group = SimulatedGroup(2, timeout=0.3)
    local = LocalTier(tmp_path / "ramdisk-0", "local")
    peer = PeerCopy(local, Member(rank=0, local_rank=0, world_size=2, node="node-0"), "127.0.0.1")
    peer.setup(group.member(0))  # rank 1 never comes
    assert peer.ready and peer.server is None and peer.pusher is None and peer.token is None
    assert peer.successor_record() is None
    peer.offer(1)  # nothing to push to: a no-op


def test_the_reserve_is_the_size_of_the_nodes_newest_checkpoint(tmp_path: Path) -> None:
    ramdisk = tmp_path / "ramdisk"
    assert read_own_size(ramdisk) == 0  # nothing yet: no reserve
    _checkpoint(ramdisk, 20, {"a.bin": b"x" * 300}, sequence=5)
    _checkpoint(ramdisk, 30, {"a.bin": b"x" * 100, "b.bin": b"y" * 50}, sequence=4)
    assert read_own_size(ramdisk) == 300  # by commit order, not step
    (layout.checkpoint_path(ramdisk, 20) / MANIFEST_FILE).unlink()  # incomplete: not counted
    assert read_own_size(ramdisk) == 150


def test_a_successor_whose_server_is_down_means_the_persistent_tier(job, tmp_path: Path) -> None:
    _train_and_copy(job, tmp_path, 2, range(1, 4))
    shutil.rmtree(tmp_path / "ramdisk-1")
    k = _peer_job(job, tmp_path, 2)
    c0 = k.ckpts[0]
    c0.peer = PeerCopy(c0.local, c0.me, "192.0.2.1")  # TEST-NET: cannot be bound here
    restored = run_ranks(2, lambda r: k.ckpts[r].restore(ToyLoader(r)))
    assert [(x.step, x.tier.name) for x in restored] == [(2, "persistent")] * 2
    assert c0.peer.server is None and k.ckpts[1].peer.fetched == {}


class _JsonAgreement(SimulatedAgreement):
    """What the JAX adapter's agreement carries: JSON (tuples arrive as lists)."""

    def _exchange(self, obj: Any) -> list[Any]:
        return json.loads(json.dumps(super()._exchange(json.loads(json.dumps(obj)))))


def test_setup_and_recover_work_over_a_json_agreement(job, tmp_path: Path) -> None:
    _train_and_copy(job, tmp_path, 2, range(1, 4))
    shutil.rmtree(tmp_path / "ramdisk-1")
    group = SimulatedGroup(2)
    peers = [
        PeerCopy(
            LocalTier(tmp_path / f"ramdisk-{r}", "local"),
            Member(rank=r, local_rank=0, world_size=2, node=f"pod-{r}"),
            "127.0.0.1",
        )
        for r in range(2)
    ]

    def rank(r: int) -> dict[int, int]:
        io = _JsonAgreement(group, r)
        peers[r].setup(io)
        return peers[r].recover(io)

    try:
        assert run_ranks(2, rank) == [{1: 3}, {1: 3}]
    finally:
        for p in peers:
            p.close()
    fetched = tmp_path / "ramdisk-1" / "checkpoint-3"
    assert layout.verify_checkpoint(fetched, checksums=True)[1] == []


def test_sending_and_receiving_a_copy_yield_the_cpu_to_training(receiver, tmp_path: Path) -> None:
    """The pusher's thread and the server's receiving threads run at PEER_COPY_NICE (the
    training thread keeps its own): a copy is best effort, training is not."""
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    r = receiver()
    seen: list[int] = []
    put_file = r.store.put_file

    def recording(*args: Any, **kw: Any) -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        put_file(*args, **kw)

    r.store.put_file = recording  # type: ignore[method-assign]
    src = tmp_path / "ramdisk-0"
    _checkpoint(src, 5, {"rank-0.bin": os.urandom(1024)}, sequence=1)
    pusher = Pusher(r.peer, TOKEN, 0, src)
    try:
        pusher.offer(5)
        assert pusher.wait_idle(30) and pusher.pushed == [5]
        assert pusher._thread.native_id is not None
        assert os.getpriority(os.PRIO_PROCESS, pusher._thread.native_id) >= PEER_COPY_NICE
    finally:
        pusher.close()
    assert seen and min(seen) >= PEER_COPY_NICE
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # training's


# ---------------------------------------------------------------- the node's own saves first


def test_the_gate_holds_copies_until_every_own_save_is_written_and_never_past_its_bound() -> None:
    gate = SaveGate(max_pause=10)
    gate.hold()
    gate.hold()  # a JIT save begun while a periodic one is still written
    passed = threading.Event()
    threading.Thread(target=lambda: (gate.wait(), passed.set()), daemon=True).start()
    assert not passed.wait(0.3)
    gate.release()
    assert not passed.wait(0.2) and gate.shut
    gate.release()
    assert passed.wait(5) and not gate.shut and gate.paused_seconds >= 0.5
    short = SaveGate(max_pause=0.2)
    short.hold()  # a save that hangs (a dead rank): the copy goes on after the bound
    started = time.monotonic()
    assert short.wait() is False
    assert 0.2 <= time.monotonic() - started < 5
    short.close()
    short.hold()  # closing: nothing pauses any more
    assert short.wait() is True and not short.shut


def test_a_push_and_its_receipt_wait_while_their_node_writes_its_own(
    receiver, tmp_path: Path
) -> None:
    r = receiver()
    src = tmp_path / "ramdisk-0"
    data = os.urandom(3 * 1024 * 1024)
    _checkpoint(src, 5, {"rank-0.bin": data}, sequence=1)
    sending = SaveGate()
    pusher = Pusher(r.peer, TOKEN, 0, src, sending)
    try:
        sending.hold()  # the sender's node is writing its own checkpoint
        pusher.offer(5)
        assert not pusher.wait_idle(0.5)
        arriving = r.store.partial_dir(0, 5) / "rank-0.bin"
        assert r.store.holding() == {}
        assert not arriving.exists() or arriving.stat().st_size == 0  # not a byte sent yet
        sending.release()
        assert pusher.wait_idle(30) and pusher.pushed == [5]
    finally:
        pusher.close()
    assert r.store.holding() == {0: {5: 1}}

    r.store.gate = receiving = SaveGate()  # now the keeper's node is writing its own
    _checkpoint(src, 6, {"rank-0.bin": data}, sequence=2)
    receiving.hold()
    done = threading.Event()
    threading.Thread(
        target=lambda: (push_copy(r.peer, TOKEN, 0, 6, src / "checkpoint-6"), done.set()),
        daemon=True,
    ).start()
    assert not done.wait(0.5)
    assert r.store.holding() == {0: {5: 1}}  # 6 is not complete while the keeper writes
    receiving.release()
    assert done.wait(30) and r.store.holding() == {0: {6: 2}}
    assert (r.store.complete_dir(0, 6) / "rank-0.bin").read_bytes() == data


def test_a_local_save_shuts_the_gate_until_it_is_written_or_has_failed(job, tmp_path: Path) -> None:
    j = _peer_job(job, tmp_path, 2)
    run_ranks(2, lambda r: j.ckpts[r].plan())
    gates = [c.peer.gate for c in j.ckpts]
    release, entered = threading.Event(), [threading.Event(), threading.Event()]

    def save(r: int, step: int, **kw: Any) -> None:
        c = j.ckpts[r]
        c.save(step, lambda: ToySave(r, [step, r], **kw), persistent=False, local=True)

    run_ranks(2, lambda r: save(r, 1, gate=release, entered=entered[r]))
    assert all(e.wait(10) for e in entered)
    assert all(g.shut for g in gates)  # both nodes are writing their own
    release.set()
    run_ranks(2, lambda r: j.ckpts[r].session.wait())
    assert not any(g.shut for g in gates)
    run_ranks(2, lambda r: save(r, 2, fail=OSError(28, "No space left on device")))
    results = run_ranks(2, lambda r: j.ckpts[r].session.wait())
    assert not any(res.ok for res in results) and not any(g.shut for g in gates)
    release, entered = threading.Event(), [threading.Event(), threading.Event()]

    def persistent_only(r: int) -> None:
        save = lambda: ToySave(r, [3, r], gate=release, entered=entered[r])  # noqa: E731
        j.ckpts[r].save(3, save, persistent=True, local=False)

    run_ranks(2, persistent_only)
    assert all(e.wait(10) for e in entered)
    assert not any(g.shut for g in gates)  # the persistent tier alone: the copies go on
    release.set()
    run_ranks(2, lambda r: j.ckpts[r].session.wait())

    def staging_fails(r: int) -> None:
        with pytest.raises(RuntimeError, match="staging"):
            j.ckpts[r].save(4, _raise_staging, persistent=False, local=True)

    run_ranks(2, staging_fails)
    assert not any(g.shut for g in gates)
    run_ranks(2, lambda r: j.ckpts[r].close())


def _raise_staging() -> Any:
    raise RuntimeError("staging failed")


def test_close_ends_a_paused_push_at_once(receiver, tmp_path: Path) -> None:
    r = receiver()
    src = tmp_path / "ramdisk-0"
    _checkpoint(src, 5, {"rank-0.bin": os.urandom(1024 * 1024)}, sequence=1)
    gate = SaveGate()
    pusher = Pusher(r.peer, TOKEN, 0, src, gate)
    gate.hold()  # a save that does not end
    pusher.offer(5)
    _wait_sending(pusher, 5)
    time.sleep(0.1)  # at the gate by now
    started = time.monotonic()
    gate.close()  # PeerCopy.close: the gate first, then the pusher
    pusher.close()
    assert time.monotonic() - started < 5 and not pusher._thread.is_alive()
    assert pusher.pushed == [] and pusher.failures == 0  # abandoned at close, not a failure
    r.server.stop()  # waits for the receipt the close cut: it leaves nothing behind
    assert r.kept() == ["0"]


def test_copies_that_keep_being_superseded_are_said_once(receiver, tmp_path: Path, caplog) -> None:
    r = receiver()
    src = tmp_path / "ramdisk-0"
    for step in range(1, 7):
        _checkpoint(src, step, {"rank-0.bin": os.urandom(1024)}, sequence=step)
    gate = SaveGate()
    pusher = Pusher(r.peer, TOKEN, 0, src, gate)
    try:
        gate.hold()  # the node's own saves come back to back: the first copy waits
        with caplog.at_level("WARNING", logger="trainer_runtime.peer_copy"):
            pusher.offer(1)
            _wait_sending(pusher, 1)  # under way, paused at the gate
            for step in range(2, 7):
                pusher.offer(step)
        lag = [m for m in caplog.messages if "peer copies lag" in m]
        assert len(lag) == 1 and "3 local checkpoints in a row" in lag[0]
        assert pusher.skipped == 4  # 2, 3, 4 and 5; 1 is being sent, 6 is next
        gate.release()
        assert pusher.wait_idle(30) and pusher.pushed == [1, 6]
    finally:
        pusher.close()
    assert r.store.holding() == {0: {6: 6}}


def test_the_steps_asked_for_travel_in_the_commits_reports_and_never_fail_it(
    tmp_path: Path, caplog
) -> None:
    report = Report(rank=3, node="node-1", ok=True, spare=[7, 9])
    assert Report.from_wire(report.to_wire()) == report
    older = {k: v for k, v in report.to_wire().items() if k != "spare"}  # a report without it
    assert Report.from_wire(older).spare == []

    class Broken:
        told: set[int] | None = None

        def wanted(self) -> list[int]:
            raise OSError(5, "Input/output error")

        def asked(self, steps: set[int]) -> None:
            self.told = steps

    spares = Broken()
    tier = LocalTier(str(tmp_path / "ramdisk"), "local")
    commit = TierCommit(
        Solo(),
        Member(node="node-0"),
        tier,
        4,
        manifest=lambda t, reports: build_manifest(
            t.write_dir(4), step=4, epoch=0, world_size=1, framework="toy", tier="local"
        ),
        keep=1,
        spares=spares,
    )
    with caplog.at_level("WARNING", logger="trainer_runtime.protocol"):
        outcome = commit.run(lambda t, d: [])
    assert outcome.ok, outcome.error
    assert spares.told == set()  # its own node's ask is not for itself
    assert any("cannot say which steps the peer copies need" in m for m in caplog.messages)
