"""Fairness between namespaces on the real control plane: one namespace's jobs whose progress
reads are slow or never end (KWOK runs `cat` on a FIFO on this host) hold at most their
namespace's share of the exec slots, and another namespace's job stays fresh: each change of its
file shows in its TrainingProgress within one polling interval (plus exec and watch latency)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from progress_support import (
    cond,
    eventually,
    get_tp,
    progress,
    pytorchjob,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from progress_controller.schedule import ExecLimiter
from reconciler.client import Client

INTERVAL = 1.1  # FAST: 1 s plus up to 10% jitter
WITHIN = INTERVAL + 4.0  # one interval, plus exec and watch latency on a busy 2-core machine
EXEC_TIMEOUT = 6.0  # longer than WITHIN: a read that waited for a hung one could not be in time


def _release_readers(fifo: Path) -> None:
    """End every `cat` blocked on the FIFO: a writer that opens and closes gives them EOF."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


class SlowWriter(threading.Thread):
    """Feeds a FIFO one byte every 0.5 s, so each read of it takes seconds (and then fails)."""

    def __init__(self, fifo: Path) -> None:
        super().__init__(daemon=True)
        self.fifo = fifo
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet (ENXIO)
                self.stop.wait(0.05)
                continue
            try:
                for _ in range(20):
                    if self.stop.wait(0.5):
                        break
                    os.write(fd, b"{")
            except OSError:
                pass  # the reader went (its exec timed out)
            finally:
                os.close(fd)


@pytest.fixture
def other_namespace(cluster: LocalCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _fifo_job(cluster: LocalCluster, namespace: str, name: str) -> Path:
    d = cluster.exec_dir(namespace, f"{name}-master-0")
    fifo = d / "progress.json"
    os.mkfifo(fifo)
    cluster.apply(pytorchjob(name, namespace, str(fifo)))
    return fifo


async def test_slow_and_endless_reads_in_one_namespace_leave_another_fresh(
    kwok: LocalCluster, client: Client, namespace: str, other_namespace: str
) -> None:
    bad, good = namespace, other_namespace
    endless = [_fifo_job(kwok, bad, f"hang-{i}") for i in range(2)]  # no writer: never ends
    slow = [_fifo_job(kwok, bad, f"slow-{i}") for i in range(2)]
    writers = [SlowWriter(f) for f in slow]
    for w in writers:
        w.start()
    path = start_job(kwok, good, "fresh", progress(1))
    # 4 slots in all: without the share, the 4 hostile jobs could hold every one of them.
    limiter = ExecLimiter(concurrency=4, rate=50.0, burst=50, per_namespace=2)
    tasks: list[asyncio.Task] = []
    try:
        async with running_controller(client, limiter=limiter, exec_timeout=EXEC_TIMEOUT) as ctrl:
            # What the endless jobs' TrainingProgress said, watched from the start: a later
            # reason (a stall, say, on a slow run) may follow the ExecTimeout before the end.
            said: dict[str, list[str]] = {"hang-0": [], "hang-1": []}

            async def watch_endless() -> None:
                while True:
                    for name, reasons in said.items():
                        try:
                            tp = await get_tp(client, bad, name)
                        except Exception:  # a blip of the API server: look again
                            continue
                        reason = cond(tp, "Progressing").get("reason") if tp else None
                        if reason and (not reasons or reasons[-1] != reason):
                            reasons.append(reason)
                    await asyncio.sleep(0.2)

            tasks.append(asyncio.create_task(watch_endless()))

            async def step_is(step: int) -> dict | None:
                tp = await get_tp(client, good, "fresh")
                return tp if tp and (tp.get("status") or {}).get("step") == step else None

            await eventually(lambda: step_is(1), "the good job's first record", 90)
            # The hostile jobs' reads are under way: their namespace holds its share.
            await eventually(
                lambda: limiter.share.holders(bad) == 2, "the bad namespace's share in use", 60
            )
            polls = []
            for step in range(2, 10):
                write_atomic(path, progress(step))
                t0 = time.monotonic()
                tp = await eventually(lambda s=step: step_is(s), f"step {step}", WITHIN)
                assert time.monotonic() - t0 <= WITHIN
                polls.append(tp["status"]["lastPollTime"])
                # Never more than the share of the slots, whatever the bad namespace asks for.
                assert limiter.share.holders(bad) <= 2
            assert len(set(polls)) >= 4, polls  # lastPollTime advanced with the file
            assert limiter.max_in_flight <= 4
            assert limiter.refused > 0, "the bad namespace was never refused a slot"

            # What the hostile jobs got: their own reads failed (the endless ones time out).
            try:
                await eventually(
                    lambda: any("ExecTimeout" in r for r in said.values()),
                    "the endless reads' ExecTimeout",
                    60,
                )
            except AssertionError as e:
                raise AssertionError(f"{e}; their reasons in turn: {said}; {ctrl.stats}") from e
            assert ctrl.stats["reads"] > 0
    finally:
        for t in tasks:
            t.cancel()
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join(5)
        for fifo in endless + slow:
            for _ in range(3):
                _release_readers(fifo)
                await asyncio.sleep(0.1)
