"""Fixtures shared by the progress controller's cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localcluster import LocalCluster
from localcluster.binaries import MissingBinaries


@pytest.fixture(scope="module")
def kwok(cluster: LocalCluster) -> LocalCluster:
    """The session cluster, named for what these tests use of it: KWOK pods served by exec."""
    return cluster


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """Kueue (localcluster/kueue.py) for a module's tests, stopped after them; a test that needs
    it fails saying how to build it."""
    try:
        cluster.start_kueue()
    except MissingBinaries as e:
        pytest.fail(f"{e}\nBuild Kueue with hack/build-binaries.sh.", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop_kueue()
