"""kubeckpt installed on the real node the way a user installs it: `kubectl apply -k`.

One installer for the demo and the tests. The only addition is for the test session, whose real
node is tainted (the KWOK-based tests share the cluster): the add-on's pods then get the
toleration, patched in after the apply, so the manifests themselves stay the user's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import yaml

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
    """What `kubectl delete -k config/local` removes, but the CRDs (and every TrainingProgress
    with them) and the shared namespace; and what the add-on made at run time (its certificate
    Secret, the leader Lease). Waits until its pods are gone."""
    docs = yaml.safe_load_all(cluster.kubectl("kustomize", str(LOCAL_OVERLAY)).stdout)
    keep = {"CustomResourceDefinition", "Namespace"}
    rest = [d for d in docs if d and d["kind"] not in keep]
    cluster.kubectl(
        "delete",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
        "-f",
        "-",
        input=yaml.safe_dump_all(rest),
        timeout=150,
    )
    cluster.kubectl(
        "delete",
        "secret/kubeckpt-webhook-certs",
        "lease/kubeckpt-reconciler",
        "-n",
        SYSTEM_NS,
        "--ignore-not-found",
        check=False,
    )
    cluster.kubectl(
        "wait",
        "--for=delete",
        "pod",
        "-l",
        "app.kubernetes.io/name=kubeckpt",
        "-n",
        SYSTEM_NS,
        "--timeout=120s",
        check=False,
        timeout=150,
    )
