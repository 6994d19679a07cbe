"""The containerd config head that the real node and the image preload share: both must open the
same store at the same paths the node's `ctr` calls use, and only the node runs the CRI plugin (the
preload's containerd must not start a second CRI server on the node's state)."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from localcluster.image_store import containerd_config, containerd_socket, ctr_call, store_root
from localcluster.node import PAUSE_IMAGE, RealNode

CRI = "io.containerd.grpc.v1.cri"


def test_preload_config_opens_the_node_store_without_cri(tmp_path: Path) -> None:
    root, run = tmp_path / "root", tmp_path / "run"
    cfg = tomllib.loads(containerd_config(root, run, cri=False))
    assert cfg["root"] == str(root)
    assert cfg["state"] == str(run / "state")
    assert cfg["grpc"]["address"] == str(containerd_socket(run))
    assert CRI in cfg["disabled_plugins"]


def test_the_nodes_config_is_one_valid_toml_with_cri_on_the_shared_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real node's own config (its CRI settings appended to the shared head), built by a
    RealNode on a scratch workdir: a broken table there fails here, not in every node test."""
    monkeypatch.setenv("KUBECKPT_CACHE", str(tmp_path / "cache"))
    node = RealNode(cluster=SimpleNamespace(workdir=tmp_path / "work"))  # type: ignore[arg-type]
    cfg = tomllib.loads(node._containerd_config())
    assert CRI not in cfg["disabled_plugins"]
    assert "io.containerd.snapshotter.v1.overlayfs" not in cfg["disabled_plugins"]
    assert cfg["root"] == str(store_root(tmp_path / "cache"))
    # The socket the kubelet and the node's `ctr` calls use is the one containerd serves.
    assert cfg["grpc"]["address"] == str(node.sock)
    cri = cfg["plugins"][CRI]
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    assert cri["cni"]["conf_dir"] == str(node.dir / "cni" / "net.d")
    # Nothing is pulled from outside: every registry goes to a closed port.
    assert cri["registry"]["mirrors"]["docker.io"]["endpoint"] == ["http://127.0.0.1:9"]


def test_ctr_call_says_which_command_failed(tmp_path: Path) -> None:
    if shutil.which("ctr") is None:
        pytest.fail("`ctr` is not installed: run `make binaries` (it installs containerd)")
    ctr = ctr_call(containerd_socket(tmp_path))  # nothing serves it; ctr fails before dialling
    with pytest.raises(RuntimeError, match=r"ctr --address \S+containerd.sock -n k8s.io nope"):
        ctr("nope", timeout=10)
    assert ctr("nope", timeout=10, check=False) == ""  # check=False: the output, no raise


def test_two_nodes_share_no_store_socket_state_subnet_or_bridge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second real node on the same host: containerd locks its store's database and the kubelet
    kills sandboxes it does not know, so each node needs its own store, socket and state; its CNI
    config puts its pods on its own bridge and subnet (node 0's stays as it always was)."""
    monkeypatch.setenv("KUBECKPT_CACHE", str(tmp_path / "cache"))
    cluster = SimpleNamespace(workdir=tmp_path / "work")
    nodes = [RealNode(cluster=cluster, index=i) for i in (0, 1)]  # type: ignore[arg-type]
    cfgs = [tomllib.loads(n._containerd_config()) for n in nodes]
    for key in ("root", "state"):
        assert cfgs[0][key] != cfgs[1][key], key
    assert cfgs[0]["grpc"]["address"] != cfgs[1]["grpc"]["address"]
    assert cfgs[0]["root"] == str(store_root(tmp_path / "cache"))
    assert nodes[1].name == "kubeckpt-node-1" and nodes[1].ip == "10.87.1.1"
    cni = [n._cni_config()["plugins"][0] for n in nodes]
    assert [c["bridge"] for c in cni] == ["kubeckpt0", "kubeckpt1"]
    subnets = [c["ipam"]["ranges"][0][0]["subnet"] for c in cni]
    assert subnets == ["10.87.0.0/24", "10.87.1.0/24"]
    assert cni[0]["ipam"]["dataDir"] != cni[1]["ipam"]["dataDir"]
    with pytest.raises(ValueError, match="index"):
        RealNode(cluster=cluster, index=-1)  # type: ignore[arg-type]
