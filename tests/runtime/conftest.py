"""Fixtures for the runtime scenarios: uninterrupted reference runs, shared by the tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from harness import STEPS, finish, start, torchrun_argv
from train_job import train

from localcluster.seaweedfs import SeaweedFS
from tests.support.s3 import BUCKET


def _no_checkpoints(root: Path) -> dict[str, str]:
    return {
        "CHECKPOINT_ENABLED": "false",
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
    }


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-rank job run start to end without checkpointing: the bits to match."""
    root = tmp_path_factory.mktemp("ddp-reference")
    proc = start(torchrun_argv(root / "status"), _no_checkpoints(root), root / "log")
    assert finish(proc) == 0, (root / "log").read_text()
    return root / "status"


@pytest.fixture(scope="session")
def single_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single-process job run start to end without checkpointing."""
    root = tmp_path_factory.mktemp("single-reference")
    torch.set_num_threads(1)
    train(steps=STEPS, status_dir=root / "status", environ=_no_checkpoints(root))
    return root / "status"


@pytest.fixture
def s3(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, dict]]:
    """An s3fs filesystem on the session's SeaweedFS (tests/conftest.py), its bucket emptied, and
    the variables that reach it."""
    aws = seaweedfs.aws_env()
    for key, value in aws.items():
        monkeypatch.setenv(key, value)
    from trainer_runtime.storage import _s3_filesystem

    fs = _s3_filesystem()
    if keys := fs.find(BUCKET):
        fs.rm(keys)
    yield fs, aws
