"""Handing a job over from a terminating pod to its replacement: never resume past a save in flight.

A Job (and so a JobSet, and so a TrainJob) creates a replacement pod as soon as the old one starts
terminating (podReplacementPolicy TerminatingOrFailed, the default). The old pod is then still
writing its just-in-time checkpoint on the shared volume, and the replacement's restore would
see it incomplete: it would resume from the older checkpoint before it, and delete the one being
written as a leftover. So:

- while a checkpoint is written, its writer touches the sentinel every HEARTBEAT_SECONDS (the
  writer's side, heartbeat.py: a daemon thread that stops when the sentinel goes, that is when
  the checkpoint is committed or discarded, or when the process dies);
- before choosing a checkpoint, restore waits while an incomplete checkpoint, in any generation,
  has a live writer: its sentinel's modification time still changes. Step numbers do not say
  which save is newer (a run resumed from an older checkpoint writes lower steps), so every live
  one is waited for. The wait ends when it completes (restore takes it), when its heartbeat stops
  for STALE_SECONDS (its writer is gone: the usual clean-up applies), or after `timeout`, the
  grace period the victim had (the replacement is injected with the same
  TORCH_ELASTIC_SHUTDOWN_TIMEOUT), whichever comes first.

Liveness is the sentinel changing, timed by the reader's own monotonic clock: the modification
time itself is never compared with a clock. On NFS it is the server's clock (the writer's touch
asks for the server's time), which need not agree with the reader's; only its changing counts. A
sentinel left by a crash long ago therefore costs STALE_SECONDS once before the clean-up removes
it. The sentinel is opened before each look (NFS revalidates a file's attributes on open; a bare
stat may answer from the client's attribute cache for seconds). Object stores have no
modification times to heartbeat with: there the writer's manifest-last commit still keeps an
incomplete checkpoint from being taken, and restore does not wait.
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
from .contract import INCOMPLETE_SENTINEL
from .heartbeat import wait_timeout

log = logging.getLogger(__name__)

STALE_SECONDS = 5.0
POLL_SECONDS = 0.2


@dataclass
class _Watch:
    mtime_ns: int | None
    last_change: float  # the reader's monotonic clock when it last saw the sentinel change
    beat: bool = False  # seen changing: a live writer, not only presumed one


def _pending(root: Path) -> dict[tuple[int, int], Path]:
    """Incomplete checkpoints in every generation, by (generation, step)."""
    return {
        (e.generation, e.step): layout.checkpoint_path(root, e.step, e.generation)
        for e in layout.scan(root)
        if not e.complete
    }


def _writer_grace(path: Path) -> float:
    try:
        record = json.loads((path / INCOMPLETE_SENTINEL).read_text()[:4096])
        grace = float(record.get("graceSeconds", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0.0
    return min(max(grace, 0.0), 3600.0)


def _mtime_ns(path: Path) -> int | None:
    """The sentinel's modification time, as a token to compare with the last one only. Opened,
    not just stat'ed: close-to-open consistency makes an NFS client ask the server."""
    try:
        fd = os.open(path / INCOMPLETE_SENTINEL, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:  # unreadable (or a symlink): what stat says is all there is
        try:
            return os.stat(path / INCOMPLETE_SENTINEL, follow_symlinks=False).st_mtime_ns
        except FileNotFoundError:
            return None
    try:
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)


def wait_for_saves_in_flight(
    root: str | os.PathLike[str],
    *,
    timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Block while a checkpoint under `root` (any generation) is being written by a live writer
    (see the module docstring); returns the steps whose writer was seen alive (and those still
    presumed alive when the wait ran out).
    """
    root = Path(root)
    extend = timeout is None  # the writers' own grace may lengthen the default bound
    timeout = wait_timeout() if timeout is None else timeout
    start = clock()
    watches: dict[tuple[int, int], _Watch] = {}
    graced: set[tuple[int, int]] = set()
    announced = False

    def alive(live: list[tuple[int, int]]) -> list[int]:
        return sorted({k[1] for k, w in watches.items() if w.beat} | {k[1] for k in live})

    while True:
        now = clock()
        live = []
        for key, path in sorted(_pending(root).items()):
            mtime = _mtime_ns(path)
            w = watches.get(key)
            if w is None:
                # Unseen so far: alive until it stays unchanged for STALE_SECONDS by this clock.
                w = watches[key] = _Watch(mtime, now)
            elif mtime != w.mtime_ns:
                w.mtime_ns, w.last_change, w.beat = mtime, now, mtime is not None
            if mtime is not None and now - w.last_change < STALE_SECONDS:
                live.append(key)
                if extend and key not in graced:
                    graced.add(key)
                    timeout = max(timeout, _writer_grace(path))
        steps = [step for _, step in live]
        if not live:
            if announced:
                log.info("kubeckpt: no save in flight any more under %s", root)
            return alive([])
        if not announced:
            log.info(
                "kubeckpt: checkpoint(s) %s under %s may be being written by another process (a "
                "pod being replaced?): waiting up to %.0f s for them before choosing one to resume",
                steps,
                root,
                timeout,
            )
            announced = True
        if now - start >= timeout:
            log.warning(
                "kubeckpt: checkpoint(s) %s under %s still in flight after %.0f s: resuming "
                "without them",
                steps,
                root,
                timeout,
            )
            return alive(live)
        sleep(POLL_SECONDS)
