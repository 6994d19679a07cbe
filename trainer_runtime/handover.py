"""Handing a job over from a terminating pod to its replacement: never resume past a save in flight.

A Job (and so a JobSet, and so a TrainJob) creates a replacement pod as soon as the old one starts
terminating (podReplacementPolicy TerminatingOrFailed, the default). The old pod is then still
writing its just-in-time checkpoint on the shared volume, and the replacement's restore would
see it incomplete: it would resume from the older checkpoint before it, and delete the one being
written as a leftover. So:

- while a checkpoint is written, its writer touches the sentinel every HEARTBEAT_SECONDS (the
  writer's side, heartbeat.py: a daemon thread that stops when the sentinel goes, that is when
  the checkpoint is committed or discarded, or when the process dies);
- before choosing a checkpoint, restore waits while an incomplete checkpoint newer than the
  newest complete one has a live writer: its sentinel's modification time still changes. The wait
  ends when it completes (restore takes it), when its heartbeat stops for STALE_SECONDS (its writer
  is gone: the usual clean-up applies), or after `timeout`, the grace period the victim had (the
  replacement is injected with the same TORCH_ELASTIC_SHUTDOWN_TIMEOUT), whichever comes first.

Liveness is the sentinel changing as seen by the reader's own monotonic clock, so clocks of
different nodes never need to agree. A sentinel that has not changed for STALE_AT_ONCE_SECONDS
by the wall clock is taken as dead without waiting (a restart long after a crash). Object stores
have no modification times to heartbeat with: there the writer's manifest-last commit still keeps
an incomplete checkpoint from being taken, and restore does not wait.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import layout
from .contract import INCOMPLETE_SENTINEL, checkpoint_dir_name
from .heartbeat import wait_timeout

log = logging.getLogger(__name__)

STALE_SECONDS = 5.0
STALE_AT_ONCE_SECONDS = 60.0
POLL_SECONDS = 0.2


@dataclass
class _Watch:
    mtime_ns: int | None
    last_change: float


def _pending(root: Path) -> dict[int, Path]:
    """Incomplete checkpoints newer than the newest complete one."""
    entries = layout.scan(root)
    newest = max((e.step for e in entries if e.complete), default=-1)
    return {
        e.step: root / checkpoint_dir_name(e.step)
        for e in entries
        if not e.complete and e.step > newest
    }


def _writer_grace(path: Path) -> float:
    try:
        record = json.loads((path / INCOMPLETE_SENTINEL).read_text()[:4096])
        grace = float(record.get("graceSeconds", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0.0
    return min(max(grace, 0.0), 3600.0)


def _mtime_ns(path: Path) -> int | None:
    try:
        return os.stat(path / INCOMPLETE_SENTINEL).st_mtime_ns
    except FileNotFoundError:
        return None


def wait_for_saves_in_flight(
    root: str | os.PathLike[str],
    *,
    timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    wall: Callable[[], float] = time.time,
) -> list[int]:
    """Block while a newer checkpoint than the newest complete one under `root` is being written
    by a live writer (see the module docstring); returns the steps that were live when it began.
    """
    root = Path(root)
    extend = timeout is None  # the writers' own grace may lengthen the default bound
    timeout = wait_timeout() if timeout is None else timeout
    start = clock()
    watches: dict[int, _Watch] = {}
    waited: list[int] = []
    announced = False
    while True:
        now = clock()
        live = []
        for step, path in sorted(_pending(root).items()):
            mtime = _mtime_ns(path)
            w = watches.get(step)
            if w is None:
                fresh = mtime is not None and wall() - mtime / 1e9 < STALE_AT_ONCE_SECONDS
                # Unseen so far: alive until it stays unchanged for STALE_SECONDS, unless its
                # last touch is long past already.
                w = watches[step] = _Watch(mtime, now if fresh else now - STALE_SECONDS)
            elif mtime != w.mtime_ns:
                w.mtime_ns, w.last_change = mtime, now
            if mtime is not None and now - w.last_change < STALE_SECONDS:
                live.append(step)
                if extend and step not in waited:
                    timeout = max(timeout, _writer_grace(path))
        if not live:
            if announced:
                log.info("kubeckpt: no save in flight any more under %s", root)
            return waited
        if not announced:
            waited = list(live)
            log.info(
                "kubeckpt: checkpoint(s) %s under %s are being written by another process (a pod "
                "being replaced?): waiting up to %.0f s for them before choosing one to resume",
                live,
                root,
                timeout,
            )
            announced = True
        if now - start >= timeout:
            log.warning(
                "kubeckpt: checkpoint(s) %s under %s still in flight after %.0f s: resuming "
                "without them",
                live,
                root,
                timeout,
            )
            return waited
        sleep(POLL_SECONDS)
