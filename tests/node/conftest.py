"""The real node (containerd, runc, kubelet, kube-proxy, CoreDNS): started on first use.

Its pods tolerate the taint that keeps the KWOK-based tests' pods off it, and select it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from localcluster import LocalCluster, NodeUnavailable
from localcluster.images import MissingImages
from localcluster.local_webhook import ADDON_ONLY_LABEL
from localcluster.node import RealNode


@pytest.fixture(scope="session")
def real_node(cluster: LocalCluster) -> RealNode:
    try:
        return cluster.start_real_node()
    except (NodeUnavailable, MissingImages) as e:
        pytest.fail(f"no real node: {e}", pytrace=False)


@pytest.fixture
def node_ns(cluster: LocalCluster, real_node: RealNode) -> Iterator[str]:
    """A fresh namespace for pods on the real node; its pods are force-deleted afterwards so
    that the next test does not wait for their grace periods."""
    name = f"n-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # Only the add-on installed on the node serves it, not the session's local test webhook.
    cluster.kubectl("label", "namespace", name, f"{ADDON_ONLY_LABEL}=true")
    try:
        yield name
    finally:
        held = cluster.kubectl(
            "get",
            "pods",
            "-n",
            name,
            "-o",
            "jsonpath={.items[?(@.metadata.finalizers)].metadata.name}",
            check=False,
        ).stdout.split()
        for pod in held:
            cluster.kubectl(
                "patch",
                "pod",
                pod,
                "-n",
                name,
                "--type=merge",
                "-p",
                '{"metadata": {"finalizers": null}}',
                check=False,
            )
        cluster.kubectl(
            "delete", "pods", "--all", "-n", name, "--grace-period=0", "--force", check=False
        )
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
