"""Checkpoint tiers: a directory (local ramdisk, PVC mount, file://) or s3:// through fsspec.

Every tier gives writers a local directory (`write_dir`) and keeps the layout protocol of
layout.py, generations included (`<root>/generation-<N>/checkpoint-<step>`, generations.py). For
s3:// that directory is a staging copy: each rank uploads its own files (`publish`), and the
coordinator commits by uploading the manifest last and deleting the sentinel, so a checkpoint
counts only once every byte is in the bucket. Meanwhile the coordinator re-uploads the sentinel
every second with a changing body (heartbeat.py), and a replacement pod's restore waits while
its ETag changes (handover.py; `Tier.sentinels`). fsspec/s3fs are imported only when an
s3:// URI is used, so the core stays standard-library only.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Collection, Hashable
from pathlib import Path, PurePosixPath
from typing import Any, Final

from . import handover, heartbeat, layout
from .contract import (
    INCOMPLETE_SENTINEL,
    MANIFEST_FILE,
    Manifest,
    checkpoint_dir_name,
    generation_dir_name,
    parse_checkpoint_dir_name,
    parse_generation_dir_name,
    sequence_of,
)
from .fsutil import remove_tree
from .generations import Entry, expired, next_sequence

log = logging.getLogger(__name__)


class StorageError(RuntimeError):
    """A tier cannot be used (missing optional dependency, unsupported URI)."""


class S3Unavailable(StorageError):
    """s3:// without fsspec/s3fs in this Python: the image lacks them (not the bucket's fault),
    which the listing reports apart so that the CLI can name the image."""

    packages = "fsspec/s3fs"


class Tier:
    """Interface of a checkpoint tier. `name` is the manifest's tier: "local" or "persistent".

    Reads see every generation (generations.py); writes, and retention, go to `generation`, the
    one this run writes (Checkpointer.plan sets it; 0, the root itself, until then)."""

    name: str
    root: str
    generation: int = 0
    # The files writers leave in write_dir are read straight back (uploaded from a staging
    # directory): written through the page cache, not around it (direct_write).
    read_back: bool = False

    def location(self, step: int, generation: int | None = None) -> str:
        raise NotImplementedError

    def scan(self) -> list[Entry]:
        """Every checkpoint directory, in every generation."""
        raise NotImplementedError

    def generations(self) -> set[int]:
        """The generations there are, a checkpoint in them or not."""
        return {e.generation for e in self.scan()}

    def with_sequences(self, entries: list[Entry]) -> list[Entry]:
        """`entries` with each complete one's sequence read from its manifest (None for a manifest
        without one, or an invalid one); raises when a manifest cannot be read."""
        raise NotImplementedError

    def begin(self, step: int) -> Path:
        """Coordinator only: a fresh `checkpoint-<step>` holding the sentinel; its write dir."""
        raise NotImplementedError

    def write_dir(self, step: int) -> Path:
        """Where every rank writes its files for `step` (exists once `begin` returned)."""
        raise NotImplementedError

    def publish(self, step: int, relpaths: list[str]) -> None:
        """Each rank, after writing and fsyncing its files: make them durable in the tier."""

    def next_sequence(self, proposed: int) -> int:
        """Coordinator only, just before `commit`: the new checkpoint's place in commit order."""
        mine = [e for e in self.scan() if e.generation == self.generation]
        return next_sequence(proposed, self.with_sequences(mine))

    def commit(self, step: int, manifest: Manifest) -> str:
        """Coordinator only, after every rank published: manifest last, then the sentinel goes."""
        raise NotImplementedError

    def release(self, step: int) -> None:
        """Every rank, after a save ended either way: drop local staging copies."""

    def discard(self, step: int) -> None:
        """Coordinator only, after a failed save: remove what it left, to free the space."""
        raise NotImplementedError

    def remove_incomplete(self) -> list[int]:
        """Every incomplete checkpoint, in every generation (never complete ones)."""
        raise NotImplementedError

    def sentinels(self) -> handover.SentinelSource | None:
        """What a replacement's restore watches for a save in flight (handover.py); None: the
        tier has no sentinels to watch."""
        return None

    def retain(self, keep: int) -> list[int]:
        """Retention in the generation being written, by commit order (generations.expired)."""
        raise NotImplementedError

    def fetch(self, step: int, generation: int = 0) -> Path:
        """A local directory holding checkpoint `step` (downloaded first for remote tiers).
        One process per node calls it; the others use `fetch_dir`."""
        raise NotImplementedError

    def fetch_dir(self, step: int, generation: int = 0) -> Path:
        """Where `fetch` puts checkpoint `step`."""
        raise NotImplementedError

    @property
    def shared(self) -> bool:
        """Whether the tier holds one checkpoint for every node (a shared volume, a bucket): its
        commit is then coordinated by global rank 0 and its manifest lists every rank's files.
        Not so for the ramdisk, where each node's local rank 0 commits its node's own."""
        return True

    @property
    def fetched_per_node(self) -> bool:
        """Whether a restore reads a copy each node fetched (`fetch_dir` on local disk), not
        the tier's own files: a bucket's checkpoint is downloaded by every node."""
        return False

    @property
    def copy_per_node(self) -> bool:
        """Whether each node restores from a copy of its own: its own ramdisk, or its download
        of a bucket's checkpoint. Such a copy's files are hashed by their writer, and one process
        per node fetches it."""
        return not self.shared or self.fetched_per_node

    def release_fetched(self, step: int, generation: int = 0) -> None:
        """Drop what `fetch` downloaded."""


class LocalTier(Tier):
    def __init__(self, root: str | os.PathLike[str], name: str) -> None:
        self.root = str(root)
        self.name = name
        self.generation = 0
        # Steps retention keeps beyond `keep` (the peer copies set it: peer_copy/service.py).
        self.spare: Callable[[], Collection[int]] | None = None

    def __repr__(self) -> str:
        return f"LocalTier({self.name}, {self.root})"

    @property
    def directory(self) -> Path:
        """The directory of the generation this run writes."""
        return layout.generation_dir(self.root, self.generation)

    def location(self, step: int, generation: int | None = None) -> str:
        g = self.generation if generation is None else generation
        return str(layout.checkpoint_path(self.root, step, g))

    def scan(self) -> list[Entry]:
        return layout.scan(self.root)

    def generations(self) -> set[int]:
        return set(layout.generation_dirs(self.root))

    def with_sequences(self, entries: list[Entry]) -> list[Entry]:
        return layout.with_sequences(self.root, entries)

    def next_sequence(self, proposed: int) -> int:
        mine = layout.scan_dir(self.directory, self.generation)
        return next_sequence(proposed, self.with_sequences(mine))

    def begin(self, step: int) -> Path:
        return layout.begin(self.directory, step)

    def write_dir(self, step: int) -> Path:
        return self.directory / checkpoint_dir_name(step)

    def commit(self, step: int, manifest: Manifest) -> str:
        layout.finalize(self.write_dir(step), manifest)
        return self.location(step)

    def discard(self, step: int) -> None:
        remove_tree(self.write_dir(step))

    def remove_incomplete(self) -> list[int]:
        return layout.remove_incomplete(self.root)

    def sentinels(self) -> handover.SentinelSource:
        return handover.Directory(self.root)

    def retain(self, keep: int) -> list[int]:
        spare = self.spare() if self.spare is not None else ()
        return layout.retain(self.root, keep, self.generation, spare)

    def fetch(self, step: int, generation: int = 0) -> Path:
        return self.fetch_dir(step, generation)

    def fetch_dir(self, step: int, generation: int = 0) -> Path:
        return layout.checkpoint_path(self.root, step, generation)

    @property
    def shared(self) -> bool:
        # The ramdisk tier is per node; CHECKPOINT_URI paths are a shared (RWX) mount.
        return self.name != "local"


class S3Tier(Tier):
    """`s3://bucket/prefix` through s3fs. Credentials and endpoint come from the usual AWS
    variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...)."""

    read_back = True

    def __init__(self, uri: str, staging_dir: str | os.PathLike[str], *, fs: Any = None) -> None:
        self.name = "persistent"
        self.uri = uri.rstrip("/")
        self.root = self.uri.split("://", 1)[1]
        self.staging = Path(staging_dir)
        self.fs = fs if fs is not None else _s3_filesystem()
        self.generation = 0
        self._beats: dict[str, heartbeat.Heartbeat] = {}  # sentinel key -> its heartbeat

    def __repr__(self) -> str:
        return f"S3Tier({self.uri})"

    def _prefix(self, generation: int) -> str:
        return self.root if generation == 0 else f"{self.root}/{generation_dir_name(generation)}"

    def _key(self, step: int, rel: str = "", generation: int | None = None) -> str:
        g = self.generation if generation is None else generation
        base = f"{self._prefix(g)}/{checkpoint_dir_name(step)}"
        return f"{base}/{rel}" if rel else base

    def location(self, step: int, generation: int | None = None) -> str:
        g = self.generation if generation is None else generation
        scheme = self.uri.split("://", 1)[0]
        return f"{scheme}://{self._key(step, generation=g)}"

    def _objects(self) -> dict[tuple[int, int], set[str]]:
        """(generation, step) -> the names of the objects under that checkpoint."""
        self.fs.invalidate_cache()
        try:
            keys = self.fs.find(self.root)
        except FileNotFoundError:
            return {}
        seen: dict[tuple[int, int], set[str]] = {}
        for key in keys:
            rel = PurePosixPath(key).relative_to(self.root).parts
            generation = 0
            if len(rel) >= 3 and (n := parse_generation_dir_name(rel[0])) is not None:
                generation, rel = n, rel[1:]
            if len(rel) < 2:
                continue
            step = parse_checkpoint_dir_name(rel[0])
            if step is not None:
                seen.setdefault((generation, step), set()).add("/".join(rel[1:]))
        return seen

    def scan(self) -> list[Entry]:
        return [
            Entry(
                step=step,
                complete=MANIFEST_FILE in files and INCOMPLETE_SENTINEL not in files,
                generation=generation,
            )
            for (generation, step), files in sorted(self._objects().items())
        ]

    def with_sequences(self, entries: list[Entry]) -> list[Entry]:
        out = []
        for e in entries:
            if e.complete:
                data = self.fs.cat_file(self._key(e.step, MANIFEST_FILE, e.generation))
                e = dataclasses.replace(e, sequence=sequence_of(data))
            out.append(e)
        return out

    def begin(self, step: int) -> Path:
        sentinel = self._key(step, INCOMPLETE_SENTINEL)
        self._stop_beat(sentinel)
        self._rm(step)
        # The sentinel, then one small PUT a second on a daemon thread while the upload runs: a
        # replacement pod's restore waits while it beats (handover.py). Stopped before the
        # sentinel is deleted (`_stop_beat`).
        self._beats[sentinel] = heartbeat.start_upload(
            checkpoint_dir_name(step), lambda body: self.fs.pipe(sentinel, body)
        )
        local = self.write_dir(step)
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        return local

    def write_dir(self, step: int) -> Path:
        return self.staging / "upload" / checkpoint_dir_name(step)

    def publish(self, step: int, relpaths: list[str]) -> None:
        local = self.write_dir(step)
        for rel in relpaths:
            self.fs.put_file(str(local / rel), self._key(step, rel))

    def commit(self, step: int, manifest: Manifest) -> str:
        sentinel = self._key(step, INCOMPLETE_SENTINEL)
        # Stopped first: a beat after the delete would bring the sentinel back, and the
        # committed checkpoint would read as incomplete (and be removed at the next resume).
        # The manifest's small PUT is well within STALE_SECONDS of the last beat.
        self._stop_beat(sentinel)
        self.fs.pipe(self._key(step, MANIFEST_FILE), manifest.to_json().encode("utf-8"))
        self.fs.rm(sentinel)
        return self.location(step)

    def _stop_beat(self, sentinel: str) -> None:
        """Stop the heartbeat of `sentinel` and wait for a PUT it has in flight."""
        beat = self._beats.pop(sentinel, None)
        if beat is not None:
            beat.stop()
            beat.join()

    def release(self, step: int) -> None:
        shutil.rmtree(self.write_dir(step), ignore_errors=True)

    def discard(self, step: int) -> None:
        self._stop_beat(self._key(step, INCOMPLETE_SENTINEL))
        self._rm(step)
        self.release(step)

    def _rm(self, step: int, generation: int | None = None) -> None:
        try:
            # The manifest first: if the rest fails half-way, what remains reads as incomplete.
            self.fs.rm(self._key(step, MANIFEST_FILE, generation))
        except FileNotFoundError:
            pass
        try:
            self.fs.rm(self._key(step, generation=generation), recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache()

    def remove_incomplete(self) -> list[int]:
        removed = [e for e in self.scan() if not e.complete]
        for e in removed:
            self._rm(e.step, e.generation)
        return [e.step for e in removed]

    def sentinels(self) -> handover.SentinelSource:
        return S3Sentinels(self)

    def retain(self, keep: int) -> list[int]:
        mine = self.with_sequences([e for e in self.scan() if e.generation == self.generation])
        doomed = [e.step for e in expired(mine, self.generation, keep)]
        for step in doomed:
            self._rm(step)
        return doomed

    def fetch_dir(self, step: int, generation: int = 0) -> Path:
        return self.staging / "restore" / checkpoint_dir_name(step)

    @property
    def shared(self) -> bool:
        return True  # one checkpoint in the bucket, whichever node wrote each file

    @property
    def fetched_per_node(self) -> bool:
        return True  # each node downloads its own copy

    def fetch(self, step: int, generation: int = 0) -> Path:
        local = self.fetch_dir(step, generation)
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True)
        self.fs.invalidate_cache()
        prefix = self._key(step, generation=generation)
        for key in self.fs.find(prefix):
            rel = PurePosixPath(key).relative_to(prefix)
            dest = local.joinpath(*rel.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(key, str(dest))
        return local

    def release_fetched(self, step: int, generation: int = 0) -> None:
        shutil.rmtree(self.fetch_dir(step, generation), ignore_errors=True)


class S3Sentinels:
    """The sentinels of an s3:// tier for handover.py: a sentinel object's token is what a HEAD
    says of it (ETag, with LastModified and size for a store whose ETag would not change), only
    ever compared with the same object's previous token. A look is one HEAD per incomplete
    checkpoint; the incomplete ones are listed again at most every LIST_SECONDS."""

    POLL_SECONDS: Final = 0.5  # heads per pending checkpoint: 2 a second
    LIST_SECONDS: Final = 2.0  # LIST requests of the whole prefix: 1 in 2 seconds

    poll_seconds = POLL_SECONDS
    list_seconds = LIST_SECONDS

    def __init__(self, tier: S3Tier) -> None:
        self.tier = tier
        self.where = tier.uri

    def pending(self) -> dict[handover.Key, str]:
        t = self.tier
        return {
            (e.generation, e.step): t._key(e.step, INCOMPLETE_SENTINEL, e.generation)
            for e in t.scan()
            if not e.complete
        }

    def token(self, handle: str) -> Hashable | None:
        try:
            info = self.tier.fs.info(handle, refresh=True)
        except FileNotFoundError:
            return None
        except Exception as e:  # throttled, unreachable: no news this time
            log.debug("kubeckpt: cannot look at %s: %s", handle, e)
            return handover.UNKNOWN
        if info.get("type") != "file":
            return None
        return (str(info.get("ETag", "")), str(info.get("LastModified", "")), info.get("size"))

    def record(self, handle: str) -> bytes:
        try:  # a ranged GET: a sentinel of any size costs this much
            data = self.tier.fs.cat_file(handle, start=0, end=handover.RECORD_BYTES)
        except Exception as e:
            log.debug("kubeckpt: cannot read %s: %s", handle, e)
            return b""
        return bytes(data[: handover.RECORD_BYTES])


def _s3_filesystem() -> Any:
    try:
        import fsspec  # optional dependency, imported only for s3:// URIs
    except ImportError as e:
        raise S3Unavailable(
            "CHECKPOINT_URI is s3:// but fsspec/s3fs are not installed: pip install 'kubeckpt[s3]'"
        ) from e
    kwargs: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        kwargs["client_kwargs"] = {"endpoint_url": endpoint}
    try:
        return fsspec.filesystem("s3", **kwargs)
    except ImportError as e:  # fsspec without s3fs
        raise S3Unavailable(f"cannot use s3:// ({e}): pip install 'kubeckpt[s3]'") from e
    except ValueError as e:
        raise StorageError(f"cannot use s3:// ({e}): pip install 'kubeckpt[s3]'") from e


def persistent_tier(uri: str, staging_dir: str) -> Tier:
    """The tier for CHECKPOINT_URI: a path, file:///path, or s3://bucket/prefix."""
    if uri.startswith("file://"):
        return LocalTier(uri[len("file://") :], "persistent")
    if "://" not in uri:
        return LocalTier(uri, "persistent")
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "s3":
        return S3Tier(uri, staging_dir)
    raise StorageError(f"CHECKPOINT_URI scheme {scheme}:// is not supported (use a path or s3://)")
