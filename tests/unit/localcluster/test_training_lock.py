"""The training image's lock (docker/training-requirements.lock) matches its requirements."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _lock_module():
    spec = importlib.util.spec_from_file_location(
        "lock_training", REPO / "hack/images/lock_training.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_the_lock_was_made_from_the_requirements_as_they_are() -> None:
    lt = _lock_module()
    lock = lt.LOCK.read_text()
    want = lt.HASH_LINE + lt.requirements_hash(lt.REQUIREMENTS.read_text())
    assert want in lock.splitlines(), "run python3 hack/images/lock_training.py"


def test_every_requirement_is_pinned_at_its_version_and_nothing_unneeded_is() -> None:
    lt = _lock_module()
    pins = _pins(lt.LOCK.read_text())
    for line in lt.REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, version = re.split(r"==", line)
        assert pins[name.lower().replace("_", "-")] == version
    # What torch's libraries link against stays (a CPU import fails without libcudnn.so.9).
    assert {"torch", "nvidia-cublas", "nvidia-cudnn-cu13"} <= set(pins)
    assert not [n for n in pins if lt.unneeded(n)]


def test_the_lock_leaves_out_only_what_a_cpu_run_never_loads() -> None:
    lt = _lock_module()
    report = {
        "install": [
            {"metadata": {"name": n, "version": "1"}}
            for n in (
                "torch",
                "nvidia-cudnn-cu12",
                "nvidia_cudnn_cu13",
                "triton",
                "nvidia-nvtx",
                "nvidia-nccl-cu13",
            )
        ]
    }
    pins = _pins(lt.lock_text(report, "torch==1\n"))
    assert set(pins) == {"torch", "nvidia-nccl-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"}
