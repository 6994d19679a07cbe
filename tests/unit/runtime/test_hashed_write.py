"""One pass over a peer copy's bytes: written and hashed as they arrive (peer_copy/hashed_write),
on the keeper's side and on a restore's fetch, with the same digest a read-back would give."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from trainer_runtime.contract import hash_file, preferred_checksum
from trainer_runtime.peer_copy.hashed_write import BodyEnded, write_hashed


def test_the_digest_is_the_files_and_exactly_length_bytes_are_taken(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 + 17)
    body = io.BytesIO(data + b"the next request's bytes")
    target = tmp_path / "rank-0.bin"
    algorithm = preferred_checksum()
    digest = write_hashed(target, len(data), body, algorithm, chunk=1024)
    assert target.read_bytes() == data
    assert digest == hash_file(target, algorithm)[1]
    assert body.read() == b"the next request's bytes"  # nothing past the length consumed


def test_a_short_body_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "rank-0.bin"
    with pytest.raises(BodyEnded, match="10 bytes short"):
        write_hashed(target, 110, io.BytesIO(b"x" * 100), preferred_checksum(), chunk=64)
    assert not target.exists()


def test_a_symlink_in_its_place_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    target = tmp_path / "rank-0.bin"
    target.symlink_to(outside)
    write_hashed(target, 3, io.BytesIO(b"new"), preferred_checksum())
    assert not target.is_symlink() and target.read_bytes() == b"new"
    assert outside.read_bytes() == b"keep"
