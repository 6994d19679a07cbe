"""Client-certificate authentication of the API server (reconciler.admission.client_auth), over
real TLS: with a client CA loaded, a certificate it did not sign is refused in the handshake, a
protected route answers 401 to a client without one, open routes stay open, and the bundle is
replaced in place."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from localcluster import pki
from reconciler.admission import ClientCAFile, ClientCertAuth, ServingTLS
from reconciler.pem_files import pem_paths
from reconciler.pki import CertificateError

SERVER_CA = pki.make_ca("server-ca")
SERVING = pki.issue(SERVER_CA, "webhook", ips=("127.0.0.1",), server=True)
CA_A, CA_B = pki.make_ca("client-ca-a"), pki.make_ca("client-ca-b")
APISERVER_A = pki.issue(CA_A, "kube-apiserver", client=True)
OTHER_A = pki.issue(CA_A, "someone-else", client=True)
APISERVER_B = pki.issue(CA_B, "kube-apiserver", client=True)
REFUSED = (aiohttp.ClientError, ssl.SSLError, ConnectionError)


def client(cert: pki.KeyPair | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=SERVER_CA.cert_pem.decode())
    if cert is not None:
        with pem_paths(cert.cert_pem, cert.key_pem) as (crt, key):
            ctx.load_cert_chain(crt, key)
    return ctx


class Server:
    def __init__(self, tls: ServingTLS, auth: ClientCertAuth, port: int) -> None:
        self.tls, self.auth, self.port = tls, auth, port

    async def get(self, path: str, cert: pki.KeyPair | None) -> tuple[int, str]:
        # a new connection per call: a certificate is checked in the handshake
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://127.0.0.1:{self.port}{path}", ssl=client(cert)) as r:
                return r.status, await r.text()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    tls = ServingTLS()
    tls.load(SERVING.cert_pem, SERVING.key_pem)
    auth = ClientCertAuth(tls)

    async def secret(_: web.Request) -> web.Response:
        return web.Response(text="namespace data")

    async def probe(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/mutate", auth.protect(secret))
    app.router.add_get("/healthz", probe)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Server(tls, auth, port)
    finally:
        await runner.cleanup()


async def test_without_a_client_ca_nothing_is_asked_and_nothing_is_served(server: Server) -> None:
    """Until a bundle is loaded the protected route refuses everyone (it fails closed)."""
    assert await server.get("/healthz", None) == (200, "ok")
    status, body = await server.get("/mutate", APISERVER_A)
    assert status == 401 and "namespace data" not in body and "no client CA" in body


async def test_only_a_certificate_the_ca_signed_is_served(server: Server) -> None:
    assert server.tls.load_client_ca(CA_A.cert_pem)
    assert await server.get("/mutate", APISERVER_A) == (200, "namespace data")
    status, body = await server.get("/mutate", None)
    assert status == 401 and "client certificate is required" in body
    assert "namespace data" not in body
    with pytest.raises(REFUSED):  # another CA's certificate: the handshake fails
        await server.get("/mutate", APISERVER_B)
    # probes and scrapers have no certificate: open routes stay open
    assert await server.get("/healthz", None) == (200, "ok")


async def test_allowed_names(server: Server) -> None:
    server.tls.load_client_ca(CA_A.cert_pem)
    server.auth.allowed_names = frozenset({"kube-apiserver"})
    assert await server.get("/mutate", APISERVER_A) == (200, "namespace data")
    status, body = await server.get("/mutate", OTHER_A)
    assert status == 401 and "someone-else" in body and "not one of the allowed names" in body


async def test_a_replaced_bundle_is_in_force_from_the_next_handshake(server: Server) -> None:
    server.tls.load_client_ca(CA_A.cert_pem)
    assert await server.get("/mutate", APISERVER_A) == (200, "namespace data")
    assert server.tls.load_client_ca(CA_B.cert_pem)
    assert not server.tls.load_client_ca(CA_B.cert_pem)  # the same bundle: no change
    with pytest.raises(REFUSED):
        await server.get("/mutate", APISERVER_A)
    assert await server.get("/mutate", APISERVER_B) == (200, "namespace data")
    # a bundle of both (a CA rotation) takes either
    server.tls.load_client_ca(CA_A.cert_pem + CA_B.cert_pem)
    assert (await server.get("/mutate", APISERVER_A))[0] == 200
    assert (await server.get("/mutate", APISERVER_B))[0] == 200


async def test_a_new_serving_certificate_keeps_verifying_clients(server: Server) -> None:
    server.tls.load_client_ca(CA_A.cert_pem)
    renewed = pki.issue(SERVER_CA, "webhook", ips=("127.0.0.1",), server=True)
    assert server.tls.load(renewed.cert_pem, renewed.key_pem)
    with pytest.raises(REFUSED):
        await server.get("/mutate", APISERVER_B)
    assert (await server.get("/mutate", None))[0] == 401
    assert (await server.get("/mutate", APISERVER_A))[0] == 200


@pytest.mark.parametrize(
    ("bundle", "why"),
    [
        (b"", "no certificate"),
        (b"junk", "not a PEM"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "not a PEM"),
        (APISERVER_A.cert_pem, "not a CA certificate"),
    ],
)
def test_an_unusable_bundle_is_refused_and_the_previous_one_kept(bundle: bytes, why: str) -> None:
    tls = ServingTLS()
    tls.load(SERVING.cert_pem, SERVING.key_pem)
    tls.load_client_ca(CA_A.cert_pem)
    with pytest.raises(CertificateError, match=why):
        tls.load_client_ca(bundle)
    assert tls.client_ca == CA_A.cert_pem


def test_the_file_source_loads_reloads_and_keeps_the_last_good_bundle(tmp_path: Path) -> None:
    tls = ServingTLS()
    path = tmp_path / "ca.crt"
    source = ClientCAFile(path, tls)
    assert not source.load_once() and tls.client_ca is None
    assert source.last_error and "cannot read" in source.last_error
    path.write_bytes(CA_A.cert_pem)
    assert source.load_once() and tls.client_ca == CA_A.cert_pem
    assert not source.load_once()  # unchanged
    path.write_bytes(b"garbage")
    assert not source.load_once() and tls.client_ca == CA_A.cert_pem
    assert source.last_error and "not loaded" in source.last_error
    path.unlink()
    assert not source.load_once() and tls.client_ca == CA_A.cert_pem  # never back to open
    path.write_bytes(CA_B.cert_pem)
    assert source.load_once() and tls.client_ca == CA_B.cert_pem
    assert source.last_error is None
