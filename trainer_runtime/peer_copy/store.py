"""The receiver's side of a peer copy, on disk: `<ramdisk>/peers/<sender>/`.

A copy arrives file by file into `.partial-checkpoint-<step>/`, each file hashed as it is written
(with the algorithm the sender names, its manifest's); the manifest comes last and is the commit
marker: only when every file it lists arrived with its size and checksum, and nothing else did, is
it written and the directory renamed `checkpoint-<step>`. Then the sender's older copy goes. So a
sender has at most one complete copy here and one being received, and a crash half-way leaves a
partial directory that the next start removes.

Hostile or broken input is refused with a `Refused` (an HTTP status and why) and leaves nothing:
a sender that is not this node's ring predecessor, a path that escapes (absolute, `..`, through a
symlink), a body over the room left, a body shorter than declared, a manifest that does not match
what arrived. The room is the ramdisk's free space less what the node's own next checkpoint needs
(ring.room): a peer copy never takes the space of the node's own checkpoints.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Final

from ..contract import (
    MANIFEST_FILE,
    ContractError,
    Manifest,
    checkpoint_dir_name,
    checksum_available,
    hash_file,
    parse_checkpoint_dir_name,
    preferred_checksum,
    read_manifest,
    write_manifest_atomic,
)
from ..contract.manifest import CHECKSUM_ALGORITHMS, check_relative_path
from .gate import SaveGate
from .hashed_write import BodyEnded, write_hashed
from .ring import predecessor, room

log = logging.getLogger("trainer_runtime.peer_copy")

PEERS_DIR: Final = "peers"
PARTIAL_PREFIX: Final = ".partial-"


class Refused(Exception):
    """A request the store will not serve or keep: `status` is the HTTP status to answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class _Receiving:
    """The copy a sender is sending: its step and what arrived, (size, algorithm, digest)."""

    step: int
    files: dict[str, tuple[int, str, str]] = field(default_factory=dict)


def peers_root(ramdisk: str | os.PathLike[str]) -> Path:
    return Path(ramdisk) / PEERS_DIR


def free_bytes_of(path: str | os.PathLike[str]) -> int:
    """The free space of the filesystem at `path` (a memory-backed emptyDir is a tmpfs sized to
    its sizeLimit, so this is the room left under the limit)."""
    return shutil.disk_usage(path).free


class PeerStore:
    """The peer copies this node keeps (`index` of `nodes`), for its ring predecessor only.

    `reserve_bytes` says what the node's own next checkpoint needs; `free_bytes` what the ramdisk
    has free (both read at each file, so they follow the node's own saves)."""

    def __init__(
        self,
        ramdisk: str | os.PathLike[str],
        index: int,
        nodes: int,
        *,
        reserve_bytes: Callable[[], int],
        free_bytes: Callable[[], int] | None = None,
        gate: SaveGate | None = None,
    ) -> None:
        self.root = peers_root(ramdisk)
        self.gate = gate  # receiving pauses while the node writes a checkpoint of its own
        self.index = index
        self.nodes = nodes
        self.reserve_bytes = reserve_bytes
        self.free_bytes = free_bytes or (lambda: free_bytes_of(self.root))
        self.refused = 0  # requests refused, any reason (logged each)
        self.refused_for_room = 0  # copies refused because they did not fit
        self.interrupted = 0  # files whose body ended early: the sender stopped (logged as info)
        self._lock = threading.Lock()
        self._receiving: dict[int, _Receiving] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        for sender_dir in self.root.iterdir():  # what a crashed process was receiving
            if sender_dir.is_dir() and not sender_dir.is_symlink():
                for leftover in sender_dir.glob(f"{PARTIAL_PREFIX}*"):
                    shutil.rmtree(leftover, ignore_errors=True)

    # ------------------------------------------------------------------ paths

    def _sender_dir(self, sender: int) -> Path:
        return self.root / str(sender)

    def complete_dir(self, sender: int, step: int) -> Path:
        return self._sender_dir(sender) / checkpoint_dir_name(step)

    def partial_dir(self, sender: int, step: int) -> Path:
        return self._sender_dir(sender) / f"{PARTIAL_PREFIX}{checkpoint_dir_name(step)}"

    def _check_sender(self, sender: int) -> None:
        if sender != predecessor(self.index, self.nodes):
            self._refuse(403, f"node {self.index} keeps no copy for node {sender}")

    def _refuse(self, status: int, reason: str) -> None:
        self.refused += 1
        log.warning("kubeckpt: peer copy refused (%d): %s", status, reason)
        raise Refused(status, reason)

    def _clean_rel(self, rel: str) -> str:
        try:
            return check_relative_path(rel, "path")
        except ContractError as e:
            self._refuse(400, str(e))
            raise  # unreachable: _refuse raises

    # ------------------------------------------------------------------ receiving

    @contextmanager
    def _receiving_from(self, sender: int) -> Iterator[None]:
        """One request of `sender`'s under the store's lock; a refusal also drops the copy in
        progress: a sender that sends what is refused is broken, and its partial copy would only
        hold the room. The sender is checked first: another node's copy is never dropped."""
        self._check_sender(sender)
        with self._lock:
            try:
                yield
            except Refused:
                self._drop_receiving(sender)
                raise

    def put_file(
        self,
        sender: int,
        step: int,
        rel: str,
        length: int,
        body: BinaryIO,
        checksum: str | None = None,
    ) -> None:
        """Receive one file of `sender`'s copy of `step`: exactly `length` bytes from `body`,
        hashed with `checksum` (an algorithm name; default this runtime's preferred one)."""
        with self._receiving_from(sender):
            rel = self._clean_rel(rel)
            algorithm = checksum or preferred_checksum()
            if algorithm not in CHECKSUM_ALGORITHMS or not checksum_available(algorithm):
                self._refuse(400, f"checksum {algorithm!r} cannot be computed here")
            if length < 0:
                self._refuse(411, "a file needs its length")
            left = room(self.free_bytes(), self.reserve_bytes())
            if length > left:
                self.refused_for_room += 1
                self._refuse(
                    413, f"{rel}: {length} bytes from node {sender} do not fit ({left} left)"
                )
            receiving = self._receiving.get(sender)
            partial = self.partial_dir(sender, step)
            if receiving is None or receiving.step != step:
                # A newer copy supersedes the one in progress: at most one is received at a time.
                self._drop_receiving(sender)
                receiving = self._receiving[sender] = _Receiving(step)
                shutil.rmtree(partial, ignore_errors=True)
                partial.mkdir(parents=True)
            target = self._inside(partial, rel, create=True)
            pause = self.gate.wait if self.gate is not None else None
            try:
                digest = write_hashed(target, length, body, algorithm, pause=pause)
            except BodyEnded as e:
                # The sender stopped (its pod is ending) or moved on to a newer checkpoint: not
                # a request to refuse loudly. What arrived of the copy goes.
                self.interrupted += 1
                log.info("kubeckpt: node %d's copy of step %d was cut short: %s", sender, step, e)
                raise Refused(400, str(e)) from None
            except TimeoutError:
                self._refuse(408, f"{rel}: the body stopped arriving")
            except OSError as e:
                self._refuse(507, f"{rel}: cannot store it: {e.strerror}")
            receiving.files[rel] = (length, algorithm, digest)

    def commit(self, sender: int, step: int, data: bytes) -> Path:
        """The manifest of `sender`'s copy of `step`, sent last: the copy becomes complete when it
        matches what arrived, and the sender's older copy goes. Its directory."""
        with self._receiving_from(sender):
            receiving = self._receiving.get(sender)
            try:
                manifest = Manifest.from_json(data)
            except ContractError as e:
                self._refuse(400, f"manifest of node {sender}: {e}")
            if receiving is None or receiving.step != step or manifest.step != step:
                self._refuse(409, f"manifest of step {manifest.step}: no copy of it in progress")
            assert receiving is not None
            partial = self.partial_dir(sender, step)
            problems = _mismatches(manifest, receiving.files, partial)
            if problems:
                self._refuse(422, f"copy of node {sender}: " + "; ".join(problems[:5]))
            write_manifest_atomic(partial, manifest)
            done = self.complete_dir(sender, step)
            shutil.rmtree(done, ignore_errors=True)
            os.rename(partial, done)
            del self._receiving[sender]
            for older in self._sender_dir(sender).iterdir():
                if older != done and parse_checkpoint_dir_name(older.name) is not None:
                    shutil.rmtree(older, ignore_errors=True)
            log.info(
                "kubeckpt: keeping node %d's copy of step %d (%d bytes of the ramdisk)",
                sender,
                step,
                manifest.total_size,
            )
            return done

    def _drop_receiving(self, sender: int) -> None:
        receiving = self._receiving.pop(sender, None)
        if receiving is not None:
            shutil.rmtree(self.partial_dir(sender, receiving.step), ignore_errors=True)

    def _inside(self, directory: Path, rel: str, *, create: bool = False) -> Path:
        """`directory/rel`, refused unless it stays inside `directory` with no symlink on the
        way; its directories are made when `create`, one at a time, each checked before the
        next, so nothing is ever made through a symlink."""
        parts = PurePosixPath(rel).parts
        current = directory
        for part in parts[:-1]:
            current = current / part
            if current.is_symlink():
                self._refuse(400, f"{rel}: a symlink on the way")
            if create and not current.exists():
                try:
                    current.mkdir()
                except OSError as e:
                    self._refuse(400, f"{rel}: {e.strerror}")
            if not current.is_dir():
                self._refuse(400, f"{rel}: not a directory on the way")
        target = directory.joinpath(*parts)
        real = os.path.realpath(directory)
        if os.path.commonpath([real, os.path.realpath(target.parent)]) != real:
            self._refuse(400, f"{rel}: escapes the copy's directory")
        if os.path.realpath(target.parent) != os.path.join(real, *PurePosixPath(rel).parts[:-1]):
            self._refuse(400, f"{rel}: a symlink on the way")
        return target

    # ------------------------------------------------------------------ serving

    def holding(self) -> dict[int, dict[int, int]]:
        """Sender -> step -> sequence of every complete copy kept."""
        held: dict[int, dict[int, int]] = {}
        for sender_dir in sorted(self.root.iterdir()):
            if not sender_dir.name.isdigit() or sender_dir.is_symlink():
                continue
            for copy in sender_dir.iterdir():
                step = parse_checkpoint_dir_name(copy.name)
                if step is None or not (copy / MANIFEST_FILE).is_file():
                    continue
                try:
                    sequence = read_manifest(copy).sequence or 0
                except (OSError, ContractError):
                    continue
                held.setdefault(int(sender_dir.name), {})[step] = sequence
        return held

    def open(self, sender: int, step: int, rel: str | None) -> tuple[int, int]:
        """(fd, size) of a file of the complete copy (`rel` None: its manifest), for a GET."""
        directory = self.complete_dir(sender, step)
        if not (directory / MANIFEST_FILE).is_file():
            self._refuse(404, f"no copy of node {sender}'s step {step} here")
        if rel is not None:
            rel = self._clean_rel(rel)
        path = directory / MANIFEST_FILE if rel is None else self._inside(directory, rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as e:
            self._refuse(404, f"{rel}: {e.strerror}")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self._refuse(404, f"{rel}: not a regular file")
        return fd, st.st_size


def _mismatches(
    manifest: Manifest, received: dict[str, tuple[int, str, str]], directory: Path
) -> list[str]:
    """How what arrived differs from `manifest`: missing, extra, wrong size or content. A file
    hashed on arrival with an algorithm the manifest does not give is hashed again with one it
    does (a sender that did not say which)."""
    problems = []
    listed = {f.path for f in manifest.files}
    problems += [f"not in the manifest: {p}" for p in sorted(set(received) - listed)]
    for f in manifest.files:
        got = received.get(f.path)
        if got is None:
            problems.append(f"missing file: {f.path}")
            continue
        size, algorithm, digest = got
        if size == f.size and algorithm not in f.checksums:
            algorithm, _ = f.checksum
            try:
                _, digest = hash_file(directory.joinpath(*PurePosixPath(f.path).parts), algorithm)
            except (OSError, ContractError) as e:
                problems.append(f"cannot check {f.path}: {e}")
                continue
        if size != f.size:
            problems.append(f"size mismatch: {f.path}: expected {f.size} bytes, got {size}")
        elif f.checksums.get(algorithm) != digest:
            problems.append(f"checksum mismatch: {f.path} ({algorithm})")
    return problems
