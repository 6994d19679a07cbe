"""cert-manager mode: serve the certificate mounted from a Secret volume and follow its updates.

cert-manager writes the Certificate into a Secret (`tls.crt`, `tls.key`, `ca.crt`); the kubelet
projects it into the pod as a directory in which each file is a symlink through `..data`, itself a
symlink to a timestamped directory:

    tls.crt -> ..data/tls.crt      ..data -> ..2024_01_15_10_30_00.123456789/
    tls.key -> ..data/tls.key      ..2024_01_15_10_30_00.123456789/{tls.crt,tls.key,ca.crt}

An update writes a new timestamped directory and renames a new `..data` symlink over the old one,
atomically. We poll (every few seconds; inotify on symlink swaps is fiddly and a poll of three small
files costs nothing), resolve `..data` once per poll and read every file from that one resolved
directory, so the certificate and key always come from the same generation even if a swap happens
mid-read. Without `..data` (a plain directory, a hostPath, a test) the files are read as they are;
a certificate and key that do not match (a copy caught half-way) are skipped and read again at the
next poll, and the previous certificate keeps being served. Changes are detected by a hash of the
contents, so a touch or a rewrite with the same bytes is no reload.

The CA bundle is injected into the webhook configuration by cert-manager's cainjector (annotation
`cert-manager.io/inject-ca-from`), not by us.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ..pki import CertificateError
from .serving_tls import ServingTLS

log = logging.getLogger(__name__)


class PolledFiles:
    """What every polled file source shares: a change is a change of the contents' hash (a touch
    is no reload), a load that fails keeps what is loaded, and one error is logged once however
    often the poll sees it."""

    def __init__(self, poll_interval: float) -> None:
        self.poll_interval = poll_interval
        self._seen: bytes | None = None  # hash of the last contents looked at, loadable or not
        self.last_error: str | None = None

    def load_once(self) -> bool:
        raise NotImplementedError

    def _load_if_new(self, contents: bytes, load: Callable[[], bool], what: str) -> bool:
        digest = hashlib.sha256(contents).digest()
        if digest == self._seen:
            return False
        self._seen = digest
        try:
            changed = load()
        except CertificateError as e:
            self._note_error(f"{what} not loaded: {e}")
            return False
        self.last_error = None
        return changed

    def _note_error(self, message: str) -> None:
        if message != self.last_error:
            log.warning("%s", message)
        self.last_error = message

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            self.load_once()
            await asyncio.sleep(self.poll_interval)


class FileCertSource(PolledFiles):
    """Loads `tls.crt`/`tls.key` (and `ca.crt` if present) from `directory` into `tls`, and keeps
    reloading them when they change while `run()` runs."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        tls: ServingTLS | None = None,
        *,
        poll_interval: float = 5.0,
        cert_file: str = "tls.crt",
        key_file: str = "tls.key",
        ca_file: str = "ca.crt",
    ) -> None:
        super().__init__(poll_interval)
        self.directory = Path(directory)
        self.tls = tls if tls is not None else ServingTLS()
        self.cert_file, self.key_file, self.ca_file = cert_file, key_file, ca_file

    def _read(self) -> tuple[bytes, bytes, bytes | None]:
        base = self.directory
        data_link = base / "..data"
        if data_link.is_symlink() or data_link.is_dir():
            base = Path(os.path.realpath(data_link))  # one generation for every file
        cert = (base / self.cert_file).read_bytes()
        key = (base / self.key_file).read_bytes()
        try:
            ca: bytes | None = (base / self.ca_file).read_bytes()
        except FileNotFoundError:
            ca = None
        return cert, key, ca

    def load_once(self) -> bool:
        """Read the files and load them if their contents changed. True when a new certificate was
        loaded; False when nothing changed or the files are missing or not a matching pair (then
        `last_error` says why, and the previous certificate stays)."""
        try:
            cert, key, ca = self._read()
        except OSError as e:
            self._note_error(f"cannot read certificate files in {self.directory}: {e}")
            return False
        return self._load_if_new(
            b"\0".join((cert, key, ca or b"")),
            lambda: self.tls.load(cert, key, ca or None),
            f"certificate files in {self.directory}",
        )
