"""TLS material loads with no writable temporary directory, as in kubeckpt's containers (read-only
root filesystem, no /tmp): found when the reconciler crash-looped on the real node. And pem_paths
keeps its word, both ways (memfd and the temporary-directory fallback): the paths give
load_cert_chain exactly the given certificate and key, the data stays private, and the paths are
gone after the `with` block while the loaded context goes on serving."""

from __future__ import annotations

import os
import ssl
import stat
import subprocess
import sys
import tempfile

import pytest

from reconciler.metrics_auth import server_tls
from reconciler.pem_files import pem_paths
from reconciler.pki import self_signed


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


def served_certificate(server: ssl.SSLContext, ca_pem: bytes, host: str = "localhost") -> bytes:
    """The DER certificate `server` presents in an in-memory handshake to a client that trusts
    only `ca_pem` and checks the host name (raises ssl.SSLError when it does not verify)."""
    client_ctx = ssl.create_default_context(cadata=ca_pem.decode())
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=host)
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end in (("client", client), ("server", srv)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    assert all(done.values()), "the handshake did not finish"
    der = client.getpeercert(binary_form=True)
    assert der is not None
    return der


def ours(path: str) -> bool:
    """Whether `path` still names what pem_paths made (a memfd named kubeckpt-tls, or a file of
    its temporary directory). A closed descriptor's number may be reused by then: its link says."""
    if path.startswith("/proc/self/fd/"):
        try:
            return os.readlink(path).startswith("/memfd:kubeckpt-tls")
        except OSError:
            return False
    return os.path.lexists(path)


@pytest.fixture(params=["memfd", "tempdir"])
def storage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways pem_paths keeps the data: memfd (Linux), and the temporary directory that
    platforms without it get (forced here by hiding os.memfd_create)."""
    if request.param == "memfd":
        if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
            pytest.skip("memfd is Linux-only")
    else:
        monkeypatch.delattr(os, "memfd_create", raising=False)
    return request.param


def test_pem_paths_load_a_real_certificate_and_are_gone_after(storage: str) -> None:
    cert_pem, key_pem = self_signed(["localhost"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with pem_paths(cert_pem, key_pem) as (cert, key):
        assert cert != key
        with open(cert, "rb") as f:
            assert f.read() == cert_pem
        with open(key, "rb") as f:
            assert f.read() == key_pem
        ctx.load_cert_chain(cert, key)
        if storage == "memfd":  # anonymous memory: no file on any disk, the key included
            assert all(os.readlink(p).startswith("/memfd:kubeckpt-tls") for p in (cert, key))
        else:  # a private directory and files
            assert stat.S_IMODE(os.stat(os.path.dirname(cert)).st_mode) == 0o700
            assert {stat.S_IMODE(os.stat(p).st_mode) for p in (cert, key)} == {0o600}
    assert not ours(cert) and not ours(key)
    if storage == "tempdir":
        assert not os.path.exists(os.path.dirname(cert))
    # What the context loaded outlives the paths (metrics_auth and serving_tls rely on it), and
    # it is the certificate that was given.
    assert served_certificate(ctx, cert_pem) == ssl.PEM_cert_to_DER_cert(cert_pem.decode())


def test_pem_paths_give_the_loader_exactly_the_data(storage: str) -> None:
    cert_pem, _ = self_signed(["localhost"])
    _, other_key = self_signed(["localhost"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with pem_paths(cert_pem, other_key) as (cert, key), pytest.raises(ssl.SSLError):
        ctx.load_cert_chain(cert, key)  # a key that is not the certificate's is refused
    binary = bytes(range(256)) * 4096  # 1 MiB, every byte value
    with pem_paths(binary, b"") as (cert, key):
        with open(cert, "rb") as f:
            assert f.read() == binary
        with open(key, "rb") as f:
            assert f.read() == b""


def test_pem_paths_are_gone_when_the_block_raises(storage: str) -> None:
    with pytest.raises(RuntimeError), pem_paths(b"cert", b"key") as (cert, key):
        assert ours(cert) and ours(key)
        raise RuntimeError("boom")
    assert not ours(cert) and not ours(key)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd is Linux-only")
def test_memfd_paths_are_not_inherited_by_a_child_process() -> None:
    """The key stays in this process: the descriptors are close-on-exec, so a program it starts
    (even one that keeps every inheritable descriptor) cannot read them."""
    probe = (
        "import os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        print(os.readlink(p))\n"
        "    except OSError:\n"
        "        print('-')\n"
    )
    with pem_paths(b"cert", b"key") as (cert, key):
        assert ours(cert) and ours(key)
        child = subprocess.run(
            [sys.executable, "-c", probe, cert, key],
            close_fds=False,
            capture_output=True,
            text=True,
            check=True,
        )
    assert "kubeckpt-tls" not in child.stdout
