"""torch.distributed.checkpoint for multi-rank persistent checkpoints.

Each rank writes its own shard files (`__<rank>_<n>.distcp`, fsynced by DCP), the coordinator
writes `.metadata` once all ranks' writes succeeded; DCP reshards on load, so a job can resume with
another world size. These calls run on the manager's I/O process group.

The files are hashed as DCP writes them (a FileSystemWriter whose streams hash each chunk before
writing it), so the manifest's checksums cost no second read of the checkpoint; `hash_files`
re-reads only files `save` did not write.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Generator, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.utils.serialization import config as serialization_config

from ..contract import format_checksum, hash_file, new_hasher, preferred_checksum
from ..fsutil import WRITE_PIECE as CHUNK
from ..fsutil import lower_thread_priority, write_all
from .plain import WrittenFile

METADATA = ".metadata"
_SMALL_WRITE = 64 * 1024  # torch.save's zip headers: gathered into one write


class _HashingStream(io.RawIOBase):
    """A write-only file that hashes every byte written to it, in order, and starts the device
    writing each chunk (fsutil.write_all). Writes always complete (DCP ignores short writes)."""

    def __init__(self, path: Path, algorithm: str) -> None:
        super().__init__()
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.digest = new_hasher(algorithm)
        self.algorithm = algorithm
        self.size = 0  # bytes handed to the file so far
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        if n < _SMALL_WRITE:
            self._pending += view
            if len(self._pending) >= CHUNK:
                self._drain()
            return n
        self._drain()
        for start in range(0, n, CHUNK):  # hashed while still in the CPU cache, then written
            self._put(view[start : start + CHUNK])
        return n

    def _drain(self) -> None:
        if self._pending:
            self._put(memoryview(self._pending))
            self._pending = bytearray()

    def _put(self, chunk: memoryview) -> None:
        self.digest.update(chunk)
        write_all(self.fd, chunk, self.size)
        self.size += len(chunk)

    def tell(self) -> int:
        return self.size + len(self._pending)

    def flush(self) -> None:
        if not self.closed:
            self._drain()

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._drain()
        finally:
            os.close(self.fd)
            super().close()

    def checksum(self) -> str:
        return format_checksum(self.algorithm, self.digest.hexdigest())


class _HashingFileSystem(FileSystem):
    """DCP's local filesystem, but files opened for writing hash what is written to them."""

    def __init__(self) -> None:
        super().__init__()
        self.algorithm = preferred_checksum()
        self.written: dict[Path, _HashingStream] = {}
        self._lock = threading.Lock()  # DCP may write from several threads

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        stream = _HashingStream(path, self.algorithm)
        with self._lock:
            self.written[path] = stream
        with stream:
            yield stream

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)  # .metadata.tmp -> .metadata
        with self._lock:
            stream = self.written.pop(Path(path), None)
            if stream is not None:
                self.written[Path(new_path)] = stream

    def rm_file(self, path: str | os.PathLike) -> None:
        super().rm_file(path)
        with self._lock:
            self.written.pop(Path(path), None)


class _HashingWriter(dcp.FileSystemWriter):
    def __init__(self, path: str) -> None:
        super().__init__(path, sync_files=True, thread_count=1)
        self.fs = _HashingFileSystem()

    def files(self, directory: Path) -> list[WrittenFile]:
        """The files this process wrote into `directory`, with the checksum of their bytes."""
        out = []
        for path, stream in sorted(self.fs.written.items()):
            if path.parent == directory and stream.closed:
                out.append(WrittenFile(path.name, stream.size, stream.checksum()))
        return out


_crc_lock = threading.Lock()
_crc_users = 0
_crc_saved = True


@contextmanager
def _without_zip_crc32() -> Generator[None]:
    """torch.save (which DCP runs for every tensor) computes a CRC-32 of each record, ~0.6 s of
    CPU per GB here, and torch.load never checks it: the manifest's checksum covers the same
    bytes. The switch is process-wide; a torch.save elsewhere in the process meanwhile writes
    zeros there too, which torch.load accepts just the same."""
    global _crc_users, _crc_saved
    config = serialization_config.save
    with _crc_lock:
        if _crc_users == 0:
            _crc_saved = config.compute_crc32
            config.compute_crc32 = False
        _crc_users += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_users -= 1
            if _crc_users == 0:
                config.compute_crc32 = _crc_saved


def save(directory: Path, tree: dict[str, Any], group: Any) -> list[WrittenFile]:
    """Write this rank's part of the DCP checkpoint (and `.metadata` on the coordinator), fsynced;
    the files this rank wrote, hashed while they were written."""
    lower_thread_priority()  # a background save yields the CPU to training (fsutil.WRITER_NICE)
    directory = Path(directory)
    writer = _HashingWriter(str(directory))
    # DCP keeps one copy of a tensor every rank holds under the same key. Model buffers such as
    # BatchNorm statistics differ between DDP ranks until DDP re-broadcasts rank 0's at the next
    # forward, so rank 0's copy is the one that must be kept.
    planner = dcp.DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    with _without_zip_crc32():
        dcp.save(
            tree, storage_writer=writer, planner=planner, process_group=group, no_dist=group is None
        )
    return writer.files(directory)


def load(directory: Path, targets: dict[str, Any], group: Any) -> None:
    """Load in place into `targets` (the state dict from get_state_dict)."""
    reader = dcp.FileSystemReader(str(directory))
    dcp.load(targets, storage_reader=reader, process_group=group, no_dist=group is None)


def owned_files(directory: Path, rank: int, claimed_by_others: set[str]) -> list[str]:
    """The files of a DCP checkpoint this rank accounts for in the manifest: its shard files
    (DCP's `__<rank>_` prefix); rank 0 also takes `.metadata` and anything nobody else claims."""
    prefix = f"__{rank}_"
    names = sorted(os.listdir(directory))
    mine = [n for n in names if n.startswith(prefix) and n.endswith(".distcp")]
    if rank == 0:
        mine += [
            n
            for n in names
            if n not in mine
            and n not in claimed_by_others
            and not n.startswith("__")
            and (directory / n).is_file()
        ]
    return mine


def hash_files(
    directory: Path, names: list[str], known: Iterable[WrittenFile] = ()
) -> list[WrittenFile]:
    """`names` with size and checksum: from `known` (what `save` hashed while writing) where it
    lists the name with the size the file has now, else by reading the file."""
    hashed = {f.path: f for f in known}
    algorithm = preferred_checksum()
    out = []
    for name in names:
        entry = hashed.get(name)
        if entry is None or entry.size != os.stat(directory / name).st_size:
            size, digest = hash_file(directory / name, algorithm)
            entry = WrittenFile(name, size, format_checksum(algorithm, digest))
        out.append(entry)
    return out
