"""Fixtures of the runtime's unit tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster.seaweedfs import SeaweedFS
from tests.support.s3 import BUCKET
from tests.support.toy_ranks import Job


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Makes toy jobs (`job(n, **kw)`: tests/support/toy_ranks.Job) under tmp_path; each is closed
    at the test's end, its watchers, triggers and peer copies stopped."""
    jobs: list[Job] = []

    def make(n: int, **kw: Any) -> Job:
        jobs.append(Job(tmp_path, n, **kw))
        return jobs[-1]

    yield make
    for j in jobs:
        j.close()


@pytest.fixture
def s3_root(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, str]]:
    """A fresh prefix in the bucket of the session's SeaweedFS (tests/conftest.py), reached with
    the AWS_* variables the webhook passes."""
    for key, value in seaweedfs.aws_env().items():
        monkeypatch.setenv(key, value)
    from trainer_runtime.storage import _s3_filesystem

    yield _s3_filesystem(), f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/job"
