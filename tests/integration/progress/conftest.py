"""Fixtures shared by the progress controller's cluster tests."""

from __future__ import annotations

import pytest

from localcluster import LocalCluster


@pytest.fixture(scope="module")
def kwok(cluster: LocalCluster) -> LocalCluster:
    """The session cluster, named for what these tests use of it: KWOK pods served by exec."""
    return cluster
