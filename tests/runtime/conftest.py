"""Fixtures for the runtime scenarios: uninterrupted reference runs, shared by the tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from harness import BUCKET, STEPS, finish, start, torchrun_argv
from train_job import train

from localcluster import free_port


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


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        pytest.fail(f"needs moto's server mode: pip install 'moto[server]' ({e})", pytrace=False)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, dict]]:
    """An s3fs filesystem on the local server, a fresh bucket, and the variables that reach it."""
    aws = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_endpoint,
    }
    for key, value in aws.items():
        monkeypatch.setenv(key, value)
    from trainer_runtime.storage import _s3_filesystem

    fs = _s3_filesystem()
    if fs.exists(BUCKET):
        fs.rm(BUCKET, recursive=True)
    fs.mkdir(BUCKET)
    yield fs, aws
