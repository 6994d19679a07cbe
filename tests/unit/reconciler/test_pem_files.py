"""TLS material loads with no writable temporary directory, as in kubeckpt's containers (read-only
root filesystem, no /tmp): found when the reconciler crash-looped on the real node."""

from __future__ import annotations

import os
import ssl
import tempfile

import pytest

from reconciler.metrics_auth import server_tls
from reconciler.pem_files import pem_paths


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux-only")
def test_self_signed_metrics_tls_needs_no_temporary_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/kubeckpt-no-tmp")
    with pytest.raises(FileNotFoundError):
        tempfile.mkdtemp()  # what the old code did
    ctx = server_tls(None, hosts=("kubeckpt-reconciler-metrics.kubeckpt-system.svc",))
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_pem_paths_hold_the_data() -> None:
    with pem_paths(b"cert", b"key") as (cert, key):
        with open(cert, "rb") as f:
            assert f.read() == b"cert"
        with open(key, "rb") as f:
            assert f.read() == b"key"
