"""Peer copies of the ramdisk tier (issue 28): restore after losing one node, and the training
time a peer copy costs per checkpoint.

Usage: PYTHONPATH=.:hack python hack/bench/peer_copy.py [--dir DIR] [--persistent-dir DIR]
       [--mib 256] [--rounds 3] [--nodes 2] [--steps 160] [--period 20] [--step sleep|busy]
       [--s3] [--only restore|cost|cpu]

N simulated nodes (threads of one process, one rank each: tests/support/simulated_ranks.py),
each with its ramdisk directory under --dir (a tmpfs such as /dev/shm stands in for the pod's
memory-backed emptyDir), its peer copy server on loopback, and --mib of random state per rank
written as one file. One run saves the same step to the local tier and the persistent tier, then:

  restore  node 1's ramdisk is wiped (a replacement pod) and every rank restores:
             peer        node 1 fetches its copy from node 2's ramdisk (HTTP on loopback),
                         verifies it by content, then the restore verifies and loads as usual
             persistent  every ramdisk wiped: the restore reads the persistent tier, a directory
                         on disk (--persistent-dir, its files evicted from the page cache first:
                         a replacement pod on another node reads them cold), printed as `pvc`:
                         the local cluster's PersistentVolumes are such host directories
                         (hostPath), bind-mounted into the pod; and with --s3 a bucket on a local
                         SeaweedFS
           the same state each time (the loaded bytes are compared with the saved ones).
  cost     a training loop of steps, a local checkpoint every --period steps: the time the loop
           loses per checkpoint against the same loop without checkpoints, with peer copies off
           (the local tier alone) and on, and how many copies the keepers accepted. The target:
           on / off <= 1.2x. A step is `--step sleep` (50
           ms: the host thread of a GPU step waits, the CPU is free, as on a training node) or
           `busy` (hashing a 64 MiB buffer: every core the job has is taken, so any copy's CPU
           time is training time; the worst case, not a GPU node's).
  cpu      the CPU-seconds (the whole process, user + system) of one local checkpoint and of one
           peer copy of it (both ends: the push and the receipt), nothing else running: with busy
           steps, the copies kept times this is what the copies take from training.

Loopback and one process for every node: the figures compare the methods on one machine; they
are not a cluster's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "hack")]

from bench.benchstats import spread, target  # noqa: E402

from tests.support.simulated_ranks import SimulatedGroup, run_ranks  # noqa: E402
from trainer_runtime import layout  # noqa: E402
from trainer_runtime.config import Config  # noqa: E402
from trainer_runtime.contract import Manifest, hash_file, preferred_checksum  # noqa: E402
from trainer_runtime.contract.manifest import format_checksum  # noqa: E402
from trainer_runtime.peer_copy.client import Peer, push_copy  # noqa: E402
from trainer_runtime.peer_copy.server import PeerServer  # noqa: E402
from trainer_runtime.peer_copy.service import PeerCopy  # noqa: E402
from trainer_runtime.peer_copy.store import PeerStore  # noqa: E402
from trainer_runtime.protocol import Checkpointer, Member  # noqa: E402
from trainer_runtime.storage import LocalTier, Tier  # noqa: E402

STEP = 5
PERIOD = 5


class _File:
    def __init__(self, path: str, size: int, checksum: str) -> None:
        self.path, self.size, self.checksum = path, size, checksum


class BlobSave:
    """One rank's state: `data` written as `rank-<r>.bin`, hashed as the torch writer does."""

    def __init__(self, rank: int, data: bytes) -> None:
        self.rank, self.data = rank, data

    def prepare(self) -> None:
        pass

    def write(self, tier: Tier, directory: Path) -> list[_File]:
        name = f"rank-{self.rank}.bin"
        with open(directory / name, "wb") as f:
            f.write(self.data)
            f.flush()
            os.fsync(f.fileno())
        algorithm = preferred_checksum()
        size, digest = hash_file(directory / name, algorithm)
        return [_File(name, size, format_checksum(algorithm, digest))]


class BlobLoader:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.loaded: bytes | None = None

    def prepare(self, path: Path, manifest: Manifest, tier: Tier) -> bytes:
        return (path / f"rank-{self.rank}.bin").read_bytes()

    def apply(self, prepared: bytes, path: Path, manifest: Manifest, tier: Tier) -> None:
        self.loaded = prepared


def _env(base: Path, rank: int, persistent: str, extra: dict[str, str]) -> dict[str, str]:
    return {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": persistent,
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "1000000",
        "TRAINING_PROGRESS_FILE": str(base / f"progress-{rank}.json"),
        "CHECKPOINT_CONTROL_DIR": str(base / f"run-{rank}"),
        "KUBECKPT_TERMINATION_LOG": str(base / f"termination-{rank}"),
        "KUBECKPT_STAGING_DIR": str(base / f"staging-{rank}"),
        "CHECKPOINT_LOCAL_PERIOD": str(PERIOD),
        **extra,
    }


def _job(base: Path, n: int, persistent: str, *, peer: bool) -> list[Checkpointer]:
    comm, io = SimulatedGroup(n, 120), SimulatedGroup(n, 120)
    out = []
    for r in range(n):
        c = Checkpointer(
            Config.from_env(_env(base, r, persistent, {})),
            framework="bench",
            comm=comm.member(r),
            io=io.member(r),
            me=Member(rank=r, local_rank=0, world_size=n, node=f"node-{r}"),
        )
        c.local = LocalTier(base / f"ramdisk-{r}", "local")
        c.schedule.local_enabled = True
        if peer:
            c.peer = PeerCopy(c.local, c.me, "127.0.0.1")
        out.append(c)
    return out


def _close(ckpts: list[Checkpointer]) -> None:
    run_ranks(len(ckpts), lambda r: ckpts[r].close())


def restore_times(
    base: Path, n: int, blobs: list[bytes], persistent: str, rounds: int
) -> dict[str, list[float]]:
    """Seconds until every rank restored, from the peer copy and from the persistent tier."""
    ckpts = _job(base, n, persistent, peer=True)

    def save(r: int) -> None:
        c = ckpts[r]
        c.save(STEP, lambda: BlobSave(r, blobs[r]), persistent=True, local=True, blocking=True)
        assert c.peer is not None and c.peer.pusher is not None and c.peer.pusher.wait_idle(600)

    run_ranks(n, save, timeout=600)
    _close(ckpts)
    keep = base / "kept"
    shutil.copytree(base, keep, ignore=shutil.ignore_patterns("kept", "persistent"))
    times: dict[str, list[float]] = {"peer": [], "persistent": []}
    for _ in range(rounds):
        for how in times:
            for r in range(n):  # the same ramdisks each time
                shutil.rmtree(base / f"ramdisk-{r}", ignore_errors=True)
                shutil.copytree(keep / f"ramdisk-{r}", base / f"ramdisk-{r}")
            wiped = [1] if how == "peer" else list(range(n))
            for r in wiped:
                shutil.rmtree(base / f"ramdisk-{r}" / f"checkpoint-{STEP}")
            if how == "persistent" and "://" not in persistent:
                _evict(Path(persistent))
            job = _job(base, n, persistent, peer=how == "peer")
            loaders = [BlobLoader(r) for r in range(n)]
            started = time.perf_counter()
            restored = run_ranks(n, lambda r, j=job, ld=loaders: j[r].restore(ld[r]), timeout=600)
            times[how].append(time.perf_counter() - started)
            tier = "local (peer copy)" if how == "peer" else "persistent"
            assert [c.resumed_tier for c in job] == [tier] * n, [c.resumed_tier for c in job]
            assert all(x is not None and x.step == STEP for x in restored)
            assert [ld.loaded for ld in loaders] == blobs  # the same state, bitwise
            _close(job)
    return times


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def cpu_seconds(base: Path, blob: bytes, rounds: int) -> dict[str, list[float]]:
    """CPU-seconds of the whole process for one local checkpoint of `blob` (blocking, nothing
    else running) and for one peer copy of it to a keeper in this process (the pusher's
    `push_copy` and the keeper's server receiving, hashing and storing it: both ends)."""
    out: dict[str, list[float]] = {"local": [], "copy": []}
    ckpt = _job(base, 1, str(base / "persistent"), peer=False)[0]
    store = PeerStore(base / "keeper", 1, 2, reserve_bytes=lambda: 0)
    token = "bench"
    server = PeerServer(store, token, "127.0.0.1").start()
    try:
        for step in range(1, rounds + 1):
            before = _cpu()
            ckpt.save(step, lambda: BlobSave(0, blob), persistent=False, local=True, blocking=True)
            out["local"].append(_cpu() - before)
            directory = layout.checkpoint_path(Path(ckpt.local.root), step)
            before = _cpu()
            push_copy(Peer("127.0.0.1", server.port), token, 0, step, directory)
            out["copy"].append(_cpu() - before)
            assert store.holding() == {0: {step: step}}, store.holding()
    finally:
        server.stop()
        ckpt.close()
    return out


def _step(kind: str, buffer: bytes) -> None:
    if kind == "sleep":
        time.sleep(0.05)
    else:
        hashlib.sha256(buffer).digest()  # a core's worth of work, the GIL released


def _evict(directory: Path) -> None:
    """Drop `directory`'s files from the page cache (a cold read, as on another node)."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def loop_seconds(
    base: Path, n: int, blobs: list[bytes], steps: int, mode: str, kind: str, period: int
) -> tuple[float, int]:
    """The training loop's wall time, "none" (no checkpoints), "local" or "peer", with a local
    checkpoint every `period` steps; and how many peer copies the keepers accepted meanwhile."""
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    ckpts = _job(base, n, str(base / "persistent"), peer=mode == "peer")
    buffer = os.urandom(64 * 1024 * 1024)
    if mode == "peer":  # set up outside the timing, as a restore at the start of a run does
        run_ranks(n, lambda r: ckpts[r].plan())

    def rank(r: int) -> float:
        c = ckpts[r]
        started = time.perf_counter()
        for step in range(1, steps + 1):
            _step(kind, buffer)
            c.observe(step)
            if mode != "none" and step % period == 0:
                c.save(step, lambda: BlobSave(r, blobs[r]), persistent=False, local=True)
            c.session.reap()
        c.session.wait()
        return time.perf_counter() - started

    took = max(run_ranks(n, rank, timeout=1200))
    kept = sum(len(c.peer.pusher.pushed) for c in ckpts if c.peer and c.peer.pusher)
    _close(ckpts)
    return took, kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    parser.add_argument("--mib", type=int, default=256, help="state per rank")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument(
        "--period",
        type=int,
        default=20,
        help="steps between local checkpoints (5: the node writes its own checkpoints back to "
        "back, with no time left for a copy)",
    )
    parser.add_argument("--step", choices=("sleep", "busy"), default="sleep")
    parser.add_argument("--persistent-dir", default=tempfile.gettempdir(), help="on disk")
    parser.add_argument("--s3", action="store_true", help="also restore from SeaweedFS's S3")
    parser.add_argument("--only", choices=("restore", "cost", "cpu"), help="one part of the bench")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="kubeckpt-peer-bench-", dir=args.dir))
    blobs = [os.urandom(args.mib * 1024 * 1024) for _ in range(args.nodes)]
    print(f"{args.nodes} nodes, {args.mib} MiB per rank, {args.rounds} rounds, under {base}")
    weed: Any = None
    on_disk: Path | None = None
    try:
        on_disk = Path(tempfile.mkdtemp(prefix="kubeckpt-peer-bench-", dir=args.persistent_dir))
        persistent = {"pvc": str(on_disk / "persistent")}  # what a local-cluster PV is
        if args.s3:
            from localcluster.binaries import ensure_seaweedfs
            from localcluster.seaweedfs import SeaweedFS

            weed = SeaweedFS(ensure_seaweedfs(build=False), base / "seaweedfs")
            weed.start()
            weed.create_bucket("bench")
            os.environ.update(weed.aws_env())
            persistent["s3"] = "s3://bench/job"
        restores = persistent if args.only in (None, "restore") else {}
        if restores:
            print("\nrestore after losing node 1, seconds until every rank has loaded:")
        for name, uri in restores.items():  # one run each: its peer copy beside its tier
            run = base / f"restore-{name}"
            run.mkdir()
            times = restore_times(run, args.nodes, blobs, uri, args.rounds)
            shutil.rmtree(run, ignore_errors=True)
            peer, theirs = times["peer"], times["persistent"]
            ratios = [p / t for p, t in zip(peer, theirs, strict=True)]
            print(f"  {name} run: peer copy      {spread(peer)}")
            print(f"  {name} run: persistent     {spread(theirs)}")
            print(f"  {name} run: peer / persistent {spread(ratios)} (per round)")
        if args.only == "restore":
            return 0
        used = cpu_seconds(base / "cpu", blobs[0], args.rounds)
        shutil.rmtree(base / "cpu", ignore_errors=True)
        print(f"\nCPU-seconds (user + system, every thread), {args.mib} MiB, nothing else running:")
        print(f"  one local checkpoint            {spread(used['local'])}")
        print(f"  one peer copy (both ends)       {spread(used['copy'])}")
        ratios = [c / loc for c, loc in zip(used["copy"], used["local"], strict=True)]
        print(f"  copy / local checkpoint         {spread(ratios, 2)} (per round)")
        if args.only == "cpu":
            return 0
        cost: dict[str, list[float]] = {"none": [], "local": [], "peer": []}
        kept: list[int] = []
        for _ in range(args.rounds):
            for mode in cost:
                took, copies = loop_seconds(
                    base / "loop", args.nodes, blobs, args.steps, mode, args.step, args.period
                )
                cost[mode].append(took)
                if mode == "peer":
                    kept.append(copies)
        saves = args.steps // args.period
        lost = {
            m: [(t - b) / saves for t, b in zip(cost[m], cost["none"], strict=True)] for m in cost
        }
        print(
            f"\ntraining time lost per checkpoint ({saves} local checkpoints, {args.step} steps, "
            "seconds):"
        )
        print(f"  local tier alone    {spread(lost['local'])}")
        print(f"  with peer copies    {spread(lost['peer'])}")
        print(f"  peer / local        {target(lost['peer'], lost['local'], 1.2, at_most=True)}")
        print(
            f"  peer copies kept    {kept} of {saves * args.nodes} checkpoints per round "
            "(a copy superseded by a newer checkpoint before it was sent is skipped)"
        )
    finally:
        if weed is not None:
            weed.stop()
        shutil.rmtree(base, ignore_errors=True)
        if on_disk is not None:
            shutil.rmtree(on_disk, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
