"""Handing a job over from a terminating pod to its replacement: never resume past a save in flight.

A Job (and so a JobSet, and so a TrainJob) creates a replacement pod as soon as the old one starts
terminating (podReplacementPolicy TerminatingOrFailed, the default). The old pod is then still
writing its just-in-time checkpoint to the shared volume or the bucket, and the replacement's
restore would see it incomplete: it would resume from the older checkpoint before it, and delete
the one being written as a leftover. So:

- while a checkpoint is written, its writer changes the sentinel every HEARTBEAT_SECONDS (the
  writer's side, heartbeat.py: a daemon thread, which ends when the checkpoint is committed or
  discarded, or when the process dies). On a filesystem it touches the file; in an object store
  (s3://), which has no modification time to touch, it re-uploads the sentinel object with a
  body that differs each time, so that its ETag changes;
- before choosing a checkpoint, restore waits while an incomplete checkpoint, in any generation,
  has a live writer: its sentinel still changes. Step numbers do not say which save is newer (a
  run resumed from an older checkpoint writes lower steps), so every live one is waited for. The
  wait ends when it completes (restore takes it), when its heartbeat stops for STALE_SECONDS (its
  writer is gone: the usual clean-up applies), or after `timeout`, the grace period the victim
  had (the replacement is injected with the same TORCH_ELASTIC_SHUTDOWN_TIMEOUT; the sentinel
  carries the writer's own, which may be longer), whichever comes first.

The decision is one pure `Watcher`, fed a token of each sentinel per look; each tier says what
its token is (`SentinelSource`): a file's modification time (`Directory`, here), an object's
ETag (storage.S3Tier). A token is only compared with the previous token of the same sentinel,
and liveness is timed by the reader's own monotonic clock: no time the storage stamps is ever
compared with a clock. On NFS the mtime is the server's time (the writer's touch asks for it),
which need not agree with the reader's; an object's LastModified is the store's. A sentinel left
by a crash long ago therefore costs STALE_SECONDS once before the clean-up removes it. A file
sentinel is opened before each look (NFS revalidates a file's attributes on open; a bare stat
may answer from the client's attribute cache for seconds). Each look costs one stat, or one HEAD
request, per incomplete checkpoint, at most every `poll_seconds` of its source.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from . import layout
from .contract import INCOMPLETE_SENTINEL
from .heartbeat import wait_timeout

log = logging.getLogger(__name__)

STALE_SECONDS = 5.0
POLL_SECONDS = 0.2
RECORD_BYTES: Final = 4096  # read of a sentinel's body, whatever its size
MAX_GRACE_SECONDS: Final = 3600.0  # a sentinel's graceSeconds is clamped to this

Key = tuple[int, int]  # (generation, step) of an incomplete checkpoint


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


# A token for "could not look this time" (an error other than not found): no news, neither a
# change nor the sentinel gone.
UNKNOWN: Final = _Unknown()


class SentinelSource(Protocol):
    """What the wait needs of a tier: its incomplete checkpoints, and a token of each one's
    sentinel that changes whenever its writer beats."""

    where: str  # for the log
    poll_seconds: float  # between two looks at the sentinels
    list_seconds: float  # between two listings of the incomplete checkpoints (0: every look)

    def pending(self) -> Mapping[Key, Any]:
        """Every incomplete checkpoint, in every generation: a handle for the other calls."""
        ...

    def token(self, handle: Any) -> Hashable | None:
        """The sentinel's token: None when it is gone, UNKNOWN when it could not be looked at."""
        ...

    def record(self, handle: Any) -> bytes:
        """At most RECORD_BYTES of the sentinel's body (b"" when it cannot be read)."""
        ...


def grace_of(record: bytes) -> float:
    """The writer's grace in seconds from its sentinel's body (heartbeat.owner), 0 when
    the body says none: hostile or foreign bodies (not JSON, not an object, not a finite number)
    count as 0, and it is at most MAX_GRACE_SECONDS."""
    try:
        grace = float(json.loads(record).get("graceSeconds", 0))
    except (ValueError, AttributeError, TypeError, RecursionError):
        return 0.0
    if not math.isfinite(grace):
        return 0.0
    return min(max(grace, 0.0), MAX_GRACE_SECONDS)


@dataclass
class _Watch:
    token: Hashable | None
    last_change: float  # the reader's monotonic clock when it last saw the sentinel change
    beat: bool = False  # seen changing: a live writer, not only presumed one


@dataclass
class Watcher:
    """The wait's decisions, without I/O: fed the tokens of the pending sentinels at each look
    (`see`), it says which writers are live, and whether the wait is over (`over`)."""

    start: float
    timeout: float
    extend: bool = False  # the writers' own grace may lengthen `timeout` (`grant`)
    stale: float = STALE_SECONDS
    watches: dict[Key, _Watch] = field(default_factory=dict)
    graced: set[Key] = field(default_factory=set)

    def see(self, now: float, tokens: Mapping[Key, Hashable | None]) -> list[Key]:
        """The live writers among `tokens` (each sentinel's token at `now`), in key order. One
        unseen so far is presumed alive until it stays unchanged for `stale` by this clock; one
        gone (None) is not; UNKNOWN changes nothing."""
        live = []
        for key, token in sorted(tokens.items()):
            w = self.watches.get(key)
            if w is None:
                w = self.watches[key] = _Watch(token, now)
            elif token is not UNKNOWN and token != w.token:
                # Seen changing while it exists: a live writer, also once it has gone.
                w.token, w.last_change, w.beat = token, now, w.beat or token is not None
            if w.token is not None and now - w.last_change < self.stale:
                live.append(key)
        return live

    def ungraced(self, live: list[Key]) -> list[Key]:
        """The live writers whose grace may still lengthen the bound (each asked for once)."""
        if not self.extend:
            return []
        fresh = [k for k in live if k not in self.graced]
        self.graced.update(fresh)
        return fresh

    def grant(self, grace: float) -> None:
        """A live writer's own grace: the bound is the longest of them and the reader's."""
        self.timeout = max(self.timeout, grace)

    def over(self, now: float) -> bool:
        return now - self.start >= self.timeout

    def alive(self, live: list[Key]) -> list[int]:
        """The steps whose writer was seen alive, and those still presumed alive (`live`)."""
        seen = {k[1] for k, w in self.watches.items() if w.beat}
        return sorted(seen | {k[1] for k in live})


class Directory:
    """The sentinels of a checkpoint directory tree (a path, a PVC mount): a file's modification
    time is its token."""

    poll_seconds = POLL_SECONDS
    list_seconds = 0.0  # a directory listing is cheap: every look

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.where = str(root)

    def pending(self) -> dict[Key, Path]:
        return {
            (e.generation, e.step): layout.checkpoint_path(self.root, e.step, e.generation)
            for e in layout.scan(self.root)
            if not e.complete
        }

    def token(self, handle: Path) -> int | None:
        """The sentinel's modification time. Opened, not just stat'ed: close-to-open consistency
        makes an NFS client ask the server."""
        sentinel = handle / INCOMPLETE_SENTINEL
        try:
            fd = os.open(sentinel, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:  # unreadable (or a symlink): what stat says is all there is
            try:
                return os.stat(sentinel, follow_symlinks=False).st_mtime_ns
            except FileNotFoundError:
                return None
        try:
            return os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)

    def record(self, handle: Path) -> bytes:
        try:
            fd = os.open(handle / INCOMPLETE_SENTINEL, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return b""
        try:
            return os.read(fd, RECORD_BYTES)
        except OSError:
            return b""
        finally:
            os.close(fd)


def wait_for_saves_in_flight(
    where: str | os.PathLike[str] | SentinelSource,
    *,
    timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Block while a checkpoint (any generation) under `where`, a directory or a tier's
    `SentinelSource`, is being written by a live writer (see the module docstring); returns the
    steps whose writer was seen alive (and those still presumed alive when the wait ran out).
    Raises what the first listing of the incomplete checkpoints raises; a later listing that
    fails keeps the previous one.
    """
    source = Directory(where) if isinstance(where, str | os.PathLike) else where
    extend = timeout is None  # the writers' own grace may lengthen the default bound
    watcher = Watcher(clock(), wait_timeout() if timeout is None else timeout, extend)
    pending: dict[Key, Any] = {}
    listed_at: float | None = None
    announced = False
    while True:
        now = clock()
        if listed_at is None or now - listed_at >= source.list_seconds:
            try:
                pending = dict(source.pending())
            except Exception as e:
                if listed_at is None:
                    raise
                log.debug("kubeckpt: cannot list %s again: %s", source.where, e)
            listed_at = now
        live = watcher.see(now, {key: source.token(h) for key, h in pending.items()})
        for key in watcher.ungraced(live):
            watcher.grant(grace_of(source.record(pending[key])))
        steps = [step for _, step in live]
        if not live:
            if announced:
                log.info("kubeckpt: no save in flight any more under %s", source.where)
            return watcher.alive([])
        if not announced:
            log.info(
                "kubeckpt: checkpoint(s) %s under %s may be being written by another process (a "
                "pod being replaced?): waiting up to %.0f s for them before choosing one to resume",
                steps,
                source.where,
                watcher.timeout,
            )
            announced = True
        if watcher.over(now):
            log.warning(
                "kubeckpt: checkpoint(s) %s under %s still in flight after %.0f s: resuming "
                "without them",
                steps,
                source.where,
                watcher.timeout,
            )
            return watcher.alive(live)
        sleep(source.poll_seconds)
