"""The runtime image's s3 packages: the lister pod of `kubeckpt checkpoints` reads s3:// with
them, as the training image writes it, so their pins are the training image's; and they stay out
of what the zero-code init container copies into training pods (/opt/kubeckpt-runtime)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOCKER = REPO / "docker"


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.split("#", 1)[0].strip())
        if m:
            found[m.group(1).lower()] = m.group(2)
    return found


def test_the_runtime_images_s3_pins_are_the_training_images() -> None:
    runtime = pins(DOCKER / "runtime-requirements.txt")
    training = pins(DOCKER / "training-requirements.txt")
    assert set(runtime) == {"fsspec", "s3fs"}, runtime
    assert runtime == {k: training[k] for k in runtime}, (runtime, training)


def test_the_init_container_copies_the_runtime_alone() -> None:
    dockerfile = (DOCKER / "runtime.Dockerfile").read_text()
    copies = re.findall(r"^COPY (\S+) (\S+)$", dockerfile, re.MULTILINE)
    # trainer_runtime alone under the directory the init container copies from; the packages
    # go to a venv of the image's own, first on PATH for `python3` (the lister pod's command)
    assert ("trainer_runtime", "/opt/kubeckpt-runtime/trainer_runtime") in copies
    assert [c for c in copies if c[1].startswith("/opt/kubeckpt-runtime")] == [
        ("trainer_runtime", "/opt/kubeckpt-runtime/trainer_runtime")
    ]
    assert "-r /tmp/runtime-requirements.txt" in dockerfile
    assert re.search(
        r"^ENV PATH=/opt/venv/bin:\$PATH PYTHONPATH=/opt/kubeckpt-runtime ", dockerfile, re.M
    )
    assert "/opt/venv" not in dockerfile.split("PYTHONPATH=", 1)[1].split()[0]
    # The image build's cache key covers the requirements (a new pin rebuilds the image)
    build = (REPO / "hack" / "images" / "build.sh").read_text()
    key = build[build.index("KEY[runtime]=") :].split("sha256sum", 1)[0]
    assert "docker/runtime-requirements.txt" in key and "docker/runtime.Dockerfile" in key
