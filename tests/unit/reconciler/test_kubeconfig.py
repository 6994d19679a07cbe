"""$KUBECONFIG with several files is merged as kubectl merges it (the CLI once read only the first
file: a context defined in the second was "not found")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from reconciler.config import kubeconfig_files, load_kubeconfig


def _write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[Path, Path]:
    a = _write(
        tmp_path / "a" / "config",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "ca", "cluster": {"server": "https://a.example:6443"}}],
            "users": [{"name": "ua", "user": {"token": "token-a"}}],
            "contexts": [
                {"name": "ctx-a", "context": {"cluster": "ca", "user": "ua", "namespace": "ns-a"}}
            ],
        },
    )
    bdir = tmp_path / "b"
    bdir.mkdir()
    (bdir / "ca.crt").write_text("not parsed by the loader\n")
    (bdir / "token").write_text("token-b\n")
    b = _write(
        bdir / "config",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "ctx-b",
            "clusters": [
                {
                    "name": "cb",
                    "cluster": {
                        "server": "https://b.example:6443",
                        "certificate-authority": "ca.crt",
                    },
                }
            ],
            "users": [{"name": "ub", "user": {"tokenFile": "token"}}],
            "contexts": [
                {"name": "ctx-b", "context": {"cluster": "cb", "user": "ub", "namespace": "ns-b"}},
                # A second ctx-a: the first file's wins, as in kubectl.
                {"name": "ctx-a", "context": {"cluster": "cb", "user": "ub", "namespace": "lost"}},
            ],
        },
    )
    return a, b


def test_every_file_of_kubeconfig_counts(
    two_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, b = two_files
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(a), str(tmp_path / "gone"), str(b)]))
    assert kubeconfig_files() == [a, b]  # a missing file is skipped, as kubectl does

    # current-context from the first file that sets one (b); its user's tokenFile and CA are
    # relative to b's directory.
    cfg = load_kubeconfig()
    assert cfg.server == "https://b.example:6443" and cfg.namespace == "ns-b"
    assert cfg.token is not None and cfg.token.token() == "token-b"
    assert Path(cfg.ca_file or "").resolve() == (b.parent / "ca.crt").resolve()

    # A context of the first file; its duplicate in the second file loses.
    cfg = load_kubeconfig(context="ctx-a")
    assert cfg.server == "https://a.example:6443" and cfg.namespace == "ns-a"
    assert cfg.token is not None and cfg.token.token() == "token-a"


def test_one_named_file_is_used_alone(two_files: tuple[Path, Path]) -> None:
    a, b = two_files
    cfg = load_kubeconfig(b)
    assert cfg.server == "https://b.example:6443"
    with pytest.raises(Exception, match="ctx-b"):
        load_kubeconfig(a, context="ctx-b")  # ctx-b is in the other file only
