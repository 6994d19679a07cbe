"""The node's container images: built without Docker by hack/images/build.sh, cached by inputs."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

HACK = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = HACK / "images" / "build.sh"

# Fully qualified: containerd's CRI plugin would rewrite a short name to Docker Hub.
IMAGES = {
    "base": "kubeckpt.local/debian-python:bookworm",
    "pause": "kubeckpt.local/pause:3.10",
    "init": "kubeckpt.local/pytorch-init:local",
    "controller": "kubeckpt.local/kubeckpt:local",
    "runtime": "kubeckpt.local/kubeckpt-runtime:local",
    "training": "kubeckpt.local/kubeckpt-training:local",
}


class MissingImages(RuntimeError):
    """The images are not built and could not be built here."""


def ensure_images(names: Iterable[str] | None = None, *, build: bool = True) -> dict[str, Path]:
    """{full image name: archive} for `names` (keys of IMAGES; default all), building what is
    missing (seconds when everything is cached)."""
    wanted = list(names) if names is not None else list(IMAGES)
    argv = ["bash", str(BUILD_SCRIPT), *wanted]
    if not build:
        argv.insert(2, "--no-build")
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    if proc.returncode != 0:
        raise MissingImages(
            f"{BUILD_SCRIPT} failed (exit {proc.returncode}); its messages above say why. "
            "Build the images with `make images`."
        )
    out: dict[str, Path] = {}
    for line in proc.stdout.splitlines():
        name, _, path = line.strip().partition(" ")
        if name and path:
            out[name] = Path(path)
    missing = [IMAGES[n] for n in wanted if IMAGES[n] not in out]
    if missing:
        raise MissingImages(f"no archive for {missing}: run `make images`")
    return out
