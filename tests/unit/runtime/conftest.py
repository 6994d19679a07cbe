"""Fixtures of the runtime's unit tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def s3_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, str]]:
    """A bucket on a local moto server, reached with the AWS_* variables the webhook passes."""
    moto_server = pytest.importorskip("moto.server")
    from localcluster import free_port

    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }.items():
        monkeypatch.setenv(key, value)
    try:
        from trainer_runtime.storage import _s3_filesystem

        fs = _s3_filesystem()
        if not fs.exists("listing-test"):  # moto's state outlives its server in one process
            fs.mkdir("listing-test")
        yield fs, f"s3://listing-test/{uuid.uuid4().hex[:8]}/job"
    finally:
        server.stop()
