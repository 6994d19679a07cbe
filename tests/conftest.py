"""Session fixtures. The local control plane starts once, on first use, and stops at session end.

Tests that need it take the `cluster` fixture (and are marked `cluster`); unit tests never start it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from localcluster import LocalCluster, MissingBinaries, ensure_binaries
from localcluster.binaries import ensure_seaweedfs
from localcluster.seaweedfs import SeaweedFS
from tests.support.s3 import BUCKET


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    try:
        binaries = ensure_binaries(build=os.environ.get("KUBECKPT_NO_BUILD") != "1")
    except MissingBinaries as e:
        pytest.fail(
            f"{e}\nBuild them with `make binaries` (hack/build-binaries.sh).", pytrace=False
        )
    # A real node too where the machine can run one (tests/node), tainted so that the KWOK-based
    # tests' pods stay on KWOK nodes, and started only when a test asks for it.
    c = LocalCluster(
        nodes=3,
        binaries=binaries,
        real_nodes=1,
        taint_real_nodes=True,
        real_node_optional=True,
        defer_real_node=True,
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A real S3 server for the S3 tests: SeaweedFS (`weed server -s3`) on free loopback ports,
    one access key, the bucket of tests/support/s3.py; stopped at session end. Built on first
    use like the cluster's binaries (`build-binaries.sh --only seaweedfs`, a no-op if cached)."""
    try:
        weed = ensure_seaweedfs(build=os.environ.get("KUBECKPT_NO_BUILD") != "1")
    except MissingBinaries as e:
        pytest.fail(f"the S3 tests need SeaweedFS: {e}", pytrace=False)
    server = SeaweedFS(weed, tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for it to go)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)
