"""Authenticating the API server to an admission webhook by its client certificate.

An admission webhook's Service can be reached by anything in the cluster network, and its answers
can describe a namespace's configuration. The API server can present a client certificate when it
calls a webhook (kube-apiserver `--admission-control-config-file`, a WebhookAdmissionConfiguration
whose kubeConfigFile names a certificate per webhook host: the Kubernetes docs' "Authenticate
apiservers"). With a CA bundle loaded (`ServingTLS.load_client_ca`, from `ClientCAFile`), the TLS
layer refuses a certificate that bundle did not sign, and `ClientCertAuth.protect` answers 401 to
a request on a connection that presented none (or one whose names are not allowed), before the
handler reads anything. Paths it does not wrap (probes, metrics with their own authentication)
stay open to clients without a certificate.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

from .mounted_files import PolledFiles
from .serving_tls import ServingTLS

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def certificate_names(peercert: dict[str, Any]) -> set[str]:
    """The subject common names and DNS names of a certificate as `getpeercert()` returns it."""
    names = {
        value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"
    }
    names |= {value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"}
    return names


class ClientCertAuth:
    """Who may call the wrapped handlers: a client that presented a certificate the server's
    client CA bundle signed (the TLS layer verified it) and, when `allowed_names` is given, whose
    common name or a DNS name is one of them (needed when the CA also signs other clients'
    certificates, as a cluster's client CA does)."""

    def __init__(self, tls: ServingTLS, allowed_names: Iterable[str] = ()) -> None:
        self.tls = tls
        self.allowed_names = frozenset(allowed_names)

    def check(self, request: web.Request) -> str | None:
        """Why the request's client is refused, or None when it is authenticated."""
        if self.tls.client_ca is None:
            return "no client CA is loaded yet"
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        peercert = ssl_object.getpeercert() if ssl_object is not None else None
        if not peercert:
            return "a client certificate is required"
        if self.allowed_names:
            names = certificate_names(peercert)
            if not names & self.allowed_names:
                shown = ", ".join(sorted(names)) or "no names"
                return f"the client certificate ({shown}) is not one of the allowed names"
        return None

    def refusal(self, request: web.Request, why: str) -> web.Response:
        """The 401 answer (logged at debug: a scanner must not flood the log; count it instead)."""
        log.debug("refused %s %s from %s: %s", request.method, request.path, request.remote, why)
        return web.json_response({"error": f"unauthorized: {why}"}, status=401)

    def protect(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            why = self.check(request)
            if why is not None:
                return self.refusal(request, why)
            return await handler(request)

        return guarded


class ClientCAFile(PolledFiles):
    """Loads a PEM CA bundle from `path` into `tls` and reloads it when its contents change
    (polled: a mounted ConfigMap or Secret is replaced by a symlink swap, which a read of the path
    follows). A missing or unusable file keeps the bundle in force; before the first good read
    there is none, and `ClientCertAuth` refuses every request."""

    def __init__(
        self, path: str | os.PathLike[str], tls: ServingTLS, *, poll_interval: float = 5.0
    ):
        super().__init__(poll_interval)
        self.path = Path(path)
        self.tls = tls

    def load_once(self) -> bool:
        """True when a new bundle was loaded."""
        try:
            data = self.path.read_bytes()
        except OSError as e:
            self._note_error(f"cannot read the client CA bundle {self.path}: {e}")
            return False
        return self._load_if_new(
            data, lambda: self.tls.load_client_ca(data), f"client CA bundle {self.path}"
        )
