"""Pods for the real node: they select it, tolerate its taint and never pull."""

from __future__ import annotations

from typing import Any

from localcluster.images import IMAGES
from localcluster.node import REAL_NODE_LABEL, REAL_NODE_TAINT


def on_real_node(spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec that lands on the real node and never pulls."""
    spec.setdefault("nodeSelector", {})[REAL_NODE_LABEL] = "true"
    spec.setdefault("tolerations", []).append({**REAL_NODE_TAINT, "operator": "Equal"})
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        c.setdefault("imagePullPolicy", "Never")
    return spec


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": on_real_node({"containers": containers, **spec}),
    }


RUNTIME_IMAGE = IMAGES["runtime"]
TRAINING_IMAGE = IMAGES["training"]
CONTROLLER_IMAGE = IMAGES["controller"]
