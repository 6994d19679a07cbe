"""A server-side `ssl.SSLContext` whose certificate is replaced in place while the server runs.

The server is built once with `ServingTLS.context`; every certificate source (the self-managed
`CertManager`, the mounted-files `FileCertSource`) calls `load()` on the same `ServingTLS`.

How the swap works: each load builds a fresh inner context holding only the new certificate, and
the exposed context's SNI callback points every new handshake at the newest inner context (the
callback runs for every ClientHello, with or without SNI: the API server sends none when it calls
`https://127.0.0.1`). The new chain is also loaded into the exposed context itself with
`load_cert_chain`, so it is correct on its own too. The inner context is what makes a change of key
type safe: OpenSSL keeps one certificate slot per key type, so loading an ECDSA certificate into a
context that held an RSA one would leave the RSA one servable. Handshakes already in progress and
established connections keep the certificate they started with; nothing is dropped.

Client certificates (`load_client_ca`): once a CA bundle is loaded, every handshake asks the
client for a certificate (CERT_OPTIONAL) and refuses one the bundle did not sign; a client that
sends none still connects (probes and metrics scrapers have none), and the handler decides
(`client_auth.ClientCertAuth`). The bundle lives in each inner context, rebuilt when it changes:
OpenSSL verifies a client against the store of the context the SNI callback selected, so a
replaced bundle is in force from the next handshake on (the outer context's store only ever
grows, and is used by no handshake once a certificate is loaded).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable

from ..pem_files import pem_paths
from ..pki import CertificateError, CertInfo, check_pair, is_ca, load_certs

log = logging.getLogger(__name__)

MIN_TLS = ssl.TLSVersion.TLSv1_2

Listener = Callable[[CertInfo], object]


def _server_context(client_ca: bytes | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_TLS
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if client_ca:
        _verify_clients(ctx, client_ca)
    return ctx


def _verify_clients(ctx: ssl.SSLContext, client_ca: bytes) -> None:
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cadata=client_ca.decode("ascii"))


class ServingTLS:
    """A webhook server's TLS context, hot-reloadable, plus readiness and change notification.

    - `context`: pass it to aiohttp (`web.TCPSite(..., ssl_context=tls.context)`); TLS 1.2 minimum.
    - `has_certificate()` / `ready`: a certificate is loaded (use it in /readyz).
    - `info`: the loaded certificate (`CertInfo`), `ca_bundle`: the CA bundle PEM that came with it.
    - `generation`: counts loads that changed the certificate.
    - `await wait_changed()`, `add_listener(cb)`: notification when the certificate changes.
    """

    def __init__(self, *, on_change: Listener | None = None) -> None:
        self._context = _server_context()
        self._current: ssl.SSLContext | None = None
        self._context.sni_callback = self._select_context
        self._digest: bytes | None = None
        self._info: CertInfo | None = None
        self._ca_bundle: bytes | None = None
        self._pair: tuple[bytes, bytes] | None = None
        self._client_ca: bytes | None = None
        self._generation = 0
        self._listeners: list[Listener] = [on_change] if on_change else []
        self._changed = asyncio.Event()

    # --- what the server uses ---
    @property
    def context(self) -> ssl.SSLContext:
        return self._context

    def has_certificate(self) -> bool:
        return self._current is not None

    @property
    def ready(self) -> bool:
        return self.has_certificate()

    @property
    def info(self) -> CertInfo | None:
        return self._info

    @property
    def ca_bundle(self) -> bytes | None:
        return self._ca_bundle

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def client_ca(self) -> bytes | None:
        """The CA bundle client certificates are verified against (None: clients not asked)."""
        return self._client_ca

    def add_listener(self, callback: Listener) -> None:
        """`callback(info)` runs after each certificate change (exceptions are logged)."""
        self._listeners.append(callback)

    async def wait_changed(self) -> CertInfo:
        """Wait for the next certificate change and return the new certificate's info."""
        await self._changed.wait()
        assert self._info is not None
        return self._info

    async def wait_ready(self) -> CertInfo:
        """Return at once if a certificate is loaded, else wait for the first one (bound it with
        `asyncio.timeout`)."""
        if self._info is not None:
            return self._info
        return await self.wait_changed()

    # --- what certificate sources use ---
    def load(self, cert_pem: bytes, key_pem: bytes, ca_pem: bytes | None = None) -> bool:
        """Serve `cert_pem` (a leaf, optionally followed by intermediates) with `key_pem` from the
        next handshake on. Returns False when it is the certificate already served.

        Raises CertificateError (and keeps serving the previous certificate) when the data is not
        a certificate and its matching key.
        """
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem + b"\0" + (ca_pem or b"")).digest()
        if digest == self._digest:
            return False
        leaf = check_pair(cert_pem, key_pem)
        if ca_pem:
            load_certs(ca_pem)  # reject a malformed bundle before anything changes
        inner = _server_context(self._client_ca)
        try:
            with pem_paths(cert_pem, key_pem) as (cert_path, key_path):
                inner.load_cert_chain(cert_path, key_path)
                self._context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as e:
            raise CertificateError(f"OpenSSL rejected the certificate chain: {e}") from e
        self._current = inner
        self._pair = (cert_pem, key_pem)
        self._digest = digest
        self._ca_bundle = ca_pem or None
        self._info = CertInfo.of(leaf)
        self._generation += 1
        log.info(
            "serving certificate loaded: serial %x, %s, valid until %s",
            self._info.serial,
            ", ".join(self._info.dns_names + self._info.ip_addresses),
            self._info.not_after.isoformat(),
        )
        # Wake every waiter of this change, then arm a fresh event for the next one.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for cb in list(self._listeners):
            try:
                cb(self._info)
            except Exception:
                log.exception("certificate change listener failed")
        return True

    def load_client_ca(self, ca_pem: bytes) -> bool:
        """Verify client certificates against `ca_pem` (one or more PEM CA certificates) from the
        next handshake on. Returns False when it is the bundle already in force.

        Raises CertificateError (and keeps the previous bundle, if any) when `ca_pem` holds no
        certificate, or one that is not a CA. There is no way back to not asking: a server that
        verified its clients keeps doing so (a missing or broken file must not open it up).
        """
        if ca_pem == self._client_ca:
            return False
        certs = load_certs(ca_pem)  # CertificateError when one is malformed
        if not certs:
            raise CertificateError("no certificate in the client CA bundle")
        not_ca = [c for c in certs if not is_ca(c)]
        if not_ca:
            raise CertificateError(f"not a CA certificate: {not_ca[0].subject.rfc4514_string()}")
        inner: ssl.SSLContext | None = None
        try:
            if self._pair is not None:
                inner = _server_context(ca_pem)
                with pem_paths(*self._pair) as (cert_path, key_path):
                    inner.load_cert_chain(cert_path, key_path)
            _verify_clients(self._context, ca_pem)
        except (ssl.SSLError, UnicodeDecodeError) as e:
            raise CertificateError(f"OpenSSL rejected the client CA bundle: {e}") from e
        if inner is not None:
            self._current = inner
        self._client_ca = ca_pem
        log.info(
            "client certificates verified against %s",
            ", ".join(c.subject.rfc4514_string() for c in certs),
        )
        return True

    def _select_context(
        self, ssl_obj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        if self._current is not None:
            ssl_obj.context = self._current
