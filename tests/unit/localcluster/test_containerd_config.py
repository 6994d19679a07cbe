"""The containerd config head that the real node and the image preload share: both must open the
same store at the same paths the node's `ctr` calls use, and only the node runs the CRI plugin (the
preload's containerd must not start a second CRI server on the node's state)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from localcluster.image_store import containerd_config

CRI = "io.containerd.grpc.v1.cri"


def test_preload_config_opens_the_node_store_without_cri(tmp_path: Path) -> None:
    root, run = tmp_path / "root", tmp_path / "run"
    cfg = tomllib.loads(containerd_config(root, run, cri=False))
    assert cfg["root"] == str(root)
    assert cfg["state"] == str(run / "state")
    assert cfg["grpc"]["address"] == str(run / "containerd.sock")
    assert CRI in cfg["disabled_plugins"]


def test_node_config_keeps_cri_and_takes_its_plugin_tables(tmp_path: Path) -> None:
    head = containerd_config(tmp_path / "root", tmp_path / "run", cri=True)
    # The node appends its CRI settings after the head: the result must still be one valid TOML.
    cfg = tomllib.loads(head + f'\n[plugins."{CRI}"]\n  sandbox_image = "pause"\n')
    assert CRI not in cfg["disabled_plugins"]
    assert cfg["plugins"][CRI]["sandbox_image"] == "pause"
    assert "io.containerd.snapshotter.v1.overlayfs" not in cfg["disabled_plugins"]
