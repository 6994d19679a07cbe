"""Writing a file as it arrives and hashing it on the way: one pass over the bytes, for both
ends of a peer copy (the keeper's store receiving a push, a restore fetching its copy back), so
neither reads the file again to check it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Final

from ..contract import new_hasher

CHUNK_BYTES: Final = 1024 * 1024


class BodyEnded(Exception):
    """The body ended before the length it was announced with."""


def write_hashed(
    target: Path,
    length: int,
    body: BinaryIO,
    algorithm: str,
    chunk: int = CHUNK_BYTES,
    *,
    pause: Callable[[], object] | None = None,
) -> str:
    """Write exactly `length` bytes of `body` to `target`, a new file (a leftover of the same
    name is replaced; never through a symlink), hashing them with `algorithm`; the hex digest.
    A body that ends early raises BodyEnded, and any failure leaves no file. `pause` is called
    before each chunk (gate.SaveGate.wait: the node's own save first)."""
    if os.path.lexists(target):
        os.unlink(target)  # a retry of the same file
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    digest = new_hasher(algorithm)
    buf = bytearray(chunk)
    view = memoryview(buf)
    left = length
    try:
        while left:
            if pause is not None:
                pause()
            n = body.readinto(view[: min(left, chunk)])  # type: ignore[attr-defined]
            if not n:
                raise BodyEnded(f"{target.name}: body ended {left} bytes short")
            digest.update(view[:n])
            written = 0
            while written < n:
                written += os.write(fd, view[written:n])
            left -= n
    except BaseException:
        os.close(fd)
        os.unlink(target)
        raise
    os.close(fd)
    return digest.hexdigest()
