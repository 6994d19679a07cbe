"""The real node's image store filled ahead of the node (hack/localcluster/image_store.py): a real
containerd on a store of the test's own, with the pause image's real archive (the smallest)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from localcluster.image_store import (
    LOCK,
    MARKER,
    _import_with_own_containerd,
    import_problem,
    preload,
    store_root,
)
from localcluster.images import IMAGES, MissingImages, ensure_images

PAUSE = IMAGES["pause"]


@pytest.fixture
def pause_archive() -> dict[str, Path]:
    # What the import needs, not a free host: the session's real node may run meanwhile (the
    # stores and sockets here are the test's own).
    if why := import_problem():
        pytest.fail(
            f"importing images needs root and containerd ({why}): run `make binaries` as root",
            pytrace=False,
        )
    try:
        return {PAUSE: ensure_images(["pause"])[PAUSE]}
    except MissingImages as e:
        pytest.fail(str(e), pytrace=False)


def test_the_store_is_filled_once_and_kept(tmp_path: Path, pause_archive: dict[str, Path]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    first = _import_with_own_containerd(root, _dir(tmp_path, "a"), pause_archive)
    assert first.startswith(f"imported {PAUSE} in ")
    assert json.loads((root / MARKER).read_text()) == {PAUSE: str(pause_archive[PAUSE])}
    # A second run finds the image in containerd's own metadata and the marker: nothing to do.
    again = _import_with_own_containerd(root, _dir(tmp_path, "b"), pause_archive)
    assert again == "the node's store already holds every image"


def test_a_damaged_marker_imports_again(tmp_path: Path, pause_archive: dict[str, Path]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / MARKER).write_text('["not", "a", "map"')
    said = _import_with_own_containerd(root, _dir(tmp_path, "a"), pause_archive)
    assert said.startswith(f"imported {PAUSE}")
    # A marker naming the image while containerd lacks it (a store wiped by hand) imports it too.
    wiped = tmp_path / "wiped"
    wiped.mkdir()
    (wiped / MARKER).write_text(json.dumps({PAUSE: str(pause_archive[PAUSE])}))
    said = _import_with_own_containerd(wiped, _dir(tmp_path, "b"), pause_archive)
    assert said.startswith(f"imported {PAUSE}")


def test_a_store_in_use_is_left_alone(tmp_path: Path, pause_archive: dict[str, Path]) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    fd = os.open(cache / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running real node holds it
        said = preload(cache)
    finally:
        os.close(fd)
    assert said.startswith("skipped: a cluster with a real node runs")
    assert not store_root(cache).exists()


def _dir(tmp: Path, name: str) -> Path:
    d = tmp / name
    d.mkdir()
    return d
