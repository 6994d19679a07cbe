"""Fixtures shared by the tests against the local control plane."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from localcluster import LocalCluster
from reconciler.client import Client
from tests.support.cluster_clients import admin_config


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    """The reconciler library's client with the cluster's admin credentials, closed afterwards."""
    c = Client(admin_config(cluster))
    try:
        yield c
    finally:
        await c.close()
