"""kubeckpt installed on the real node the way a user installs it: `kubectl apply -k`.

One installer for the demo and the tests. The only addition is for the test session, whose real
node is tainted (the KWOK-based tests share the cluster): the add-on's pods then get the
toleration, patched in after the apply, so the manifests themselves stay the user's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .node import REAL_NODE_LABEL, REAL_NODE_TAINT

if TYPE_CHECKING:
    from .cluster import LocalCluster

from .cluster import REPO

SYSTEM_NS = "kubeckpt-system"
DEPLOYMENTS = ("kubeckpt-webhook", "kubeckpt-reconciler")
LOCAL_OVERLAY = REPO / "config" / "local"


def real_node_placement(spec: dict) -> dict:
    """`spec` (a pod spec) placed on the real node: its label selected, its taint tolerated."""
    spec.setdefault("nodeSelector", {})[REAL_NODE_LABEL] = "true"
    tolerations = spec.setdefault("tolerations", [])
    if not any(t.get("key") == REAL_NODE_TAINT["key"] for t in tolerations):
        tolerations.append({**REAL_NODE_TAINT, "operator": "Equal"})
    return spec


def install(cluster: LocalCluster, *, timeout: int = 180) -> str:
    """Apply config/local and wait until both Deployments are rolled out; returns kubectl's
    output."""
    node = cluster.start_real_node()
    out = cluster.kubectl("apply", "-k", str(LOCAL_OVERLAY), timeout=120).stdout
    if node.taint:
        patch = {"spec": {"template": {"spec": real_node_placement({})}}}
        for name in DEPLOYMENTS:
            cluster.kubectl(
                "patch",
                "deployment",
                name,
                "-n",
                SYSTEM_NS,
                "--type=strategic",
                "-p",
                json.dumps(patch),
            )
    for name in DEPLOYMENTS:
        cluster.kubectl(
            "rollout",
            "status",
            f"deployment/{name}",
            "-n",
            SYSTEM_NS,
            f"--timeout={timeout}s",
            timeout=timeout + 20,
        )
    return out


def uninstall(cluster: LocalCluster) -> None:
    """Remove the Deployments and the webhook configuration; not the CRDs (`delete -k` would
    take them, and every TrainingProgress with them)."""
    cluster.kubectl("delete", "mutatingwebhookconfiguration", "kubeckpt-webhook", check=False)
    cluster.kubectl("delete", "namespace", SYSTEM_NS, "--timeout=120s", check=False, timeout=150)
