"""A toy framework over N simulated ranks (threads of one process, simulated_ranks.py), for unit
tests of the save protocol (trainer_runtime.protocol) and the just-in-time stop on it: each rank's
state is a list of integers written to its own file."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path

from tests.support.simulated_ranks import SimulatedGroup
from trainer_runtime.config import Config
from trainer_runtime.contract import Manifest, hash_file
from trainer_runtime.protocol import Checkpointer, Member
from trainer_runtime.stop import JitStop
from trainer_runtime.storage import Tier


class _File:
    def __init__(self, path: str, size: int, checksum: str) -> None:
        self.path, self.size, self.checksum = path, size, checksum


class ToySave:
    """A rank's staged state; `fail` raises in write, `gate` holds the write until set."""

    def __init__(
        self,
        rank: int,
        values: list[int],
        fail: OSError | None = None,
        gate: threading.Event | None = None,
        entered: threading.Event | None = None,
    ):
        self.rank, self.values, self.fail, self.gate, self.entered = (
            rank,
            values,
            fail,
            gate,
            entered,
        )

    def prepare(self) -> None:
        pass

    def write(self, tier: Tier, directory: Path) -> list[_File]:
        if self.entered is not None:
            self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        if self.fail is not None:
            raise self.fail
        name = f"rank-{self.rank}.json"
        with open(directory / name, "w") as f:
            json.dump(self.values, f)
            f.flush()
            os.fsync(f.fileno())
        size, digest = hash_file(directory / name)
        return [_File(name, size, digest)]


class ToyLoader:
    def __init__(self, rank: int, on_apply=None) -> None:
        self.rank = rank
        self.loaded: list[int] | None = None
        self.on_apply = on_apply

    def prepare(self, path: Path, manifest: Manifest, tier: Tier) -> list[int]:
        return json.loads((path / f"rank-{self.rank}.json").read_text())

    def apply(self, prepared: list[int], path: Path, manifest: Manifest, tier: Tier) -> None:
        if self.on_apply is not None:
            self.on_apply()
        self.loaded = prepared


def _env(tmp: Path, rank: int, **extra: str) -> dict[str, str]:
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(tmp / "ckpt"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "2",
        "CHECKPOINT_MAX_CHECKPOINTS": "2",
        "TRAINING_PROGRESS_FILE": str(tmp / "progress.json"),
        "CHECKPOINT_CONTROL_DIR": str(tmp / f"run-{rank}"),  # one pod per rank
        "KUBECKPT_TERMINATION_LOG": str(tmp / f"termination-{rank}"),
        "PROGRESS_UPDATE_FREQUENCY": "1",
        "KUBECKPT_STAGING_DIR": str(tmp / f"staging-{rank}"),  # s3:// uploads: one pod per rank
    }
    env.update(extra)
    return env


class Job:
    """N ranks, each with its Checkpointer over two simulated groups (step and writer), and its
    JitStop over it (the watcher on a third)."""

    def __init__(self, tmp: Path, n: int, timeout: float = 5.0, **env: str) -> None:
        self.tmp = tmp
        self.n = n
        self.comm = SimulatedGroup(n, timeout)
        self.io = SimulatedGroup(n, timeout)
        self.ctl = SimulatedGroup(n, timeout)
        self.ckpts = [
            Checkpointer(
                Config.from_env(_env(tmp, r, **env), stop_poll_seconds=0.05),
                framework="toy",
                comm=self.comm.member(r),
                io=self.io.member(r),
                me=Member(rank=r, local_rank=0, world_size=n, node=f"node-{r}"),
            )
            for r in range(n)
        ]
        self.stops = [JitStop(c) for c in self.ckpts]

    def watch(self, takeover: float = 0.3) -> None:
        """Start every rank's stop watcher (saving ToySave states) and return at once."""
        for r, s in enumerate(self.stops):
            s.ckpt.config = dataclasses.replace(s.ckpt.config, stop_takeover_seconds=takeover)
            s.start_watcher(self.ctl.member(r), lambda step, r=r: ToySave(r, [step, r]))

    def close(self) -> None:
        for s in self.stops:
            if s.watcher is not None:
                s.watcher.close(timeout=5)
            s.triggers.close(stopped=s.stopped)
        for c in self.ckpts:  # a rank with peer copies on: its pusher and server
            if c.peer is not None:
                c.peer.close()
