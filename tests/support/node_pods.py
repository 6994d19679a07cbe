"""Pods for the real node: they select it, tolerate its taint and never pull."""

from __future__ import annotations

from typing import Any

from localcluster.addon import real_node_placement
from localcluster.images import IMAGES

RUNTIME_IMAGE = IMAGES["runtime"]


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    for c in containers:
        c.setdefault("imagePullPolicy", "Never")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": real_node_placement({"containers": containers, **spec}),
    }
