"""One version: trainer_runtime.__version__, and the places hack/set-version.sh writes it."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from trainer_runtime import __version__

REPO = Path(__file__).resolve().parents[2]


def test_manifests_and_package_carry_the_one_version() -> None:
    kust = yaml.safe_load((REPO / "config/default/kustomization.yaml").read_text())
    (image,) = kust["images"]
    assert image["newTag"] == __version__
    (labels,) = kust["labels"]
    assert labels["pairs"]["app.kubernetes.io/version"] == __version__
    # The installed distribution's metadata comes from the same attribute (pyproject: dynamic).
    assert importlib.metadata.version("kubeckpt") == __version__
    # The bases name no tag: config/default's `images` sets it, so no stale tag hides there.
    for base in ("config/webhook/deployment.yaml", "config/manager/deployment.yaml"):
        assert re.search(r"kubeckpt/kubeckpt:\S", (REPO / base).read_text()) is None, base


def test_set_version_changes_every_place(tmp_path: Path) -> None:
    """The script on a copy of the tree: every place moves, and a bad version is refused."""
    copy = tmp_path / "repo"
    for part in ("trainer_runtime/__init__.py", "config/default", "Dockerfile", "docker", "hack"):
        src = REPO / part
        dst = copy / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "bench"))
        else:
            shutil.copy2(src, dst)
    script = copy / "hack" / "set-version.sh"
    bad = subprocess.run([script, "1.2"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "not a version" in bad.stderr
    subprocess.run([script, "1.2.3"], check=True, capture_output=True)
    init = (copy / "trainer_runtime/__init__.py").read_text()
    assert '__version__ = "1.2.3"' in init
    kust = yaml.safe_load((copy / "config/default/kustomization.yaml").read_text())
    assert kust["images"][0]["newTag"] == "1.2.3"
    assert kust["labels"][0]["pairs"]["app.kubernetes.io/version"] == "1.2.3"
    for dockerfile in [copy / "Dockerfile", *sorted((copy / "docker").glob("*.Dockerfile"))]:
        text = dockerfile.read_text()
        assert __version__ + " " not in text, dockerfile
        assert ":1.2.3 " in text, dockerfile
