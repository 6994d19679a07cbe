"""Pods for the real node: they select it, tolerate its taint and never pull."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from localcluster.addon import real_node_placement
from localcluster.images import IMAGES

RUNTIME_IMAGE = IMAGES["runtime"]
REPO = Path(__file__).resolve().parents[2]


def load_demo() -> ModuleType:
    """hack/demo.py as a module: its job, policy and storage builders (hack/ is no package)."""
    spec = importlib.util.spec_from_file_location("kubeckpt_demo", REPO / "hack" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    for c in containers:
        c.setdefault("imagePullPolicy", "Never")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": real_node_placement({"containers": containers, **spec}),
    }
