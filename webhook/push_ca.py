"""The progress push endpoint's CA, as the webhook hands it to pods (issue 26).

config/components/progress-push mounts only the `ca.crt` of the endpoint's CA Secret into the
webhook (`--progress-push-ca-file`). The webhook stamps that PEM into each push pod's annotation
`kubeckpt.io/progress-push-ca` and projects the annotation as the pod's `ca.crt` (downward API), so
no CA has to be copied into tenant namespaces and the webhook needs no right there.

The file is polled like the webhook's own certificates (a mounted Secret changes by a symlink
swap). Only certificates travel: the PEM is parsed and written out again, so nothing but
certificate blocks reaches a pod, and it is size-bounded (annotations share 256 KiB per object).
A missing, oversize or unparsable file is logged as an error and pods fall back to the optional
ConfigMap `kubeckpt-progress-ca` (webhook/push_injection.py): pod creation never fails for it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Final

from reconciler.admission.mounted_files import PolledFiles
from reconciler.pki import CertificateError, bundle_pem, load_certs

log = logging.getLogger(__name__)

# A CA and a few intermediates fit many times over; far below the API server's annotation limit.
MAX_CA_BYTES: Final = 16 * 1024


def push_ca_pem(data: bytes) -> str:
    """The certificates of `data` as plain PEM (one or more, nothing else), or CertificateError."""
    if len(data) > MAX_CA_BYTES:
        raise CertificateError(f"over {MAX_CA_BYTES} bytes")
    certs = load_certs(data)  # CertificateError when a block is not a certificate
    if not certs:
        raise CertificateError("no certificate in it")
    pem = bundle_pem(certs)
    if len(pem) > MAX_CA_BYTES:  # re-encoding never grows a valid PEM much; keep the bound exact
        raise CertificateError(f"over {MAX_CA_BYTES} bytes")
    return pem.decode("ascii")


class PushCAFile(PolledFiles):
    """Holds the validated CA of `path` in `pem` (None: pods use the ConfigMap) and reloads it when
    the file's contents change while `run()` runs."""

    def __init__(self, path: str | os.PathLike[str], *, poll_interval: float = 5.0) -> None:
        super().__init__(poll_interval)
        self.path = Path(path)
        self.pem: str | None = None

    def current(self) -> str | None:
        return self.pem

    def load_once(self) -> bool:
        """True when a new CA was taken."""
        try:
            with self.path.open("rb") as f:
                data = f.read(MAX_CA_BYTES + 1)  # bounded: never read a huge file whole
        except OSError as e:
            self._seen = None  # the same contents, back again, are loaded again
            self._note_error(f"cannot read the progress push CA {self.path}: {e}")
            return False
        return self._load_if_new(data, lambda: self._take(data), f"progress push CA {self.path}")

    def _take(self, data: bytes) -> bool:
        pem = push_ca_pem(data)
        changed = pem != self.pem
        self.pem = pem
        if changed:
            log.info("progress push pods get the CA of %s", self.path)
        return changed

    def _note_error(self, message: str) -> None:
        # Unlike a serving certificate, a CA we cannot vouch for is dropped, not kept: pods fall
        # back to the ConfigMap, which an admin may fill.
        self.pem = None
        if message != self.last_error:
            log.error("%s; pods fall back to the ConfigMap kubeckpt-progress-ca", message)
        self.last_error = message
