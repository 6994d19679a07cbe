"""Fixtures of the runtime's unit tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from localcluster.seaweedfs import SeaweedFS
from tests.support.s3 import BUCKET


@pytest.fixture
def s3_root(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, str]]:
    """A fresh prefix in the bucket of the session's SeaweedFS (tests/conftest.py), reached with
    the AWS_* variables the webhook passes."""
    for key, value in seaweedfs.aws_env().items():
        monkeypatch.setenv(key, value)
    from trainer_runtime.storage import _s3_filesystem

    yield _s3_filesystem(), f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/job"
