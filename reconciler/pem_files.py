"""PEM data as file paths for `ssl.SSLContext.load_cert_chain`, which reads only files.

Containers run with a read-only root filesystem and often no writable /tmp (kubeckpt's own do), so
on Linux the "files" are anonymous memory (memfd): nothing touches a disk, the private key
included. Elsewhere: a private temporary directory (0700, files 0600) removed right after.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def pem_paths(cert_pem: bytes, key_pem: bytes) -> Iterator[tuple[str, str]]:
    """Paths of the certificate and key, valid inside the `with` block."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:
            for data in (cert_pem, key_pem):
                fd = os.memfd_create("kubeckpt-tls", os.MFD_CLOEXEC)
                fds.append(fd)
                os.write(fd, data)
            yield f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}"
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="kubeckpt-tls-") as d:
        paths = []
        for name, data in (("tls.crt", cert_pem), ("tls.key", key_pem)):
            p = os.path.join(d, name)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths.append(p)
        yield paths[0], paths[1]
