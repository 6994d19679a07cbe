"""The server's SSLContext serves a new certificate from the next handshake on, in place."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator

import pytest
from cryptography import x509

from localcluster import pki as rsa_pki  # the control plane's helper makes RSA certificates too
from reconciler import pki
from reconciler.admission.serving_tls import ServingTLS

NOW = dt.datetime.now(dt.UTC)
NAMES = ("svc.ns.svc",)


def issue(ca: pki.KeyPair) -> pki.KeyPair:
    return pki.issue_serving(
        ca,
        dns_names=NAMES,
        ip_addresses=("127.0.0.1",),
        now=NOW,
        validity=dt.timedelta(days=1),
        backdate=dt.timedelta(minutes=5),
    )


def new_ca() -> pki.KeyPair:
    return pki.make_ca("ca", now=NOW, validity=dt.timedelta(days=2), backdate=dt.timedelta(0))


def client_context(*cas: bytes, max_version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=b"".join(cas).decode())
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    if max_version is not None:
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = max_version
    return ctx


@pytest.fixture
async def server() -> AsyncIterator[tuple[ServingTLS, int]]:
    tls = ServingTLS()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=tls.context)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield tls, port
    finally:
        srv.close()
        await srv.wait_closed()


async def peer(
    port: int, ctx: ssl.SSLContext, host: str = "127.0.0.1"
) -> tuple[x509.Certificate, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=host)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der), reader, writer


async def peer_cert(port: int, ctx: ssl.SSLContext, host: str = "127.0.0.1") -> x509.Certificate:
    cert, _, writer = await peer(port, ctx, host)
    writer.close()
    return cert


def test_context_is_a_tls12_minimum_server_context_and_not_ready_before_a_load() -> None:
    tls = ServingTLS()
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.context.protocol == ssl.PROTOCOL_TLS_SERVER
    assert not tls.has_certificate() and not tls.ready and tls.info is None
    assert tls.generation == 0


async def test_reload_serves_the_new_certificate_to_new_connections_only(server) -> None:
    tls, port = server
    ca = new_ca()
    a, b = issue(ca), issue(ca)
    ctx = client_context(ca.cert_pem)
    assert tls.load(a.cert_pem, a.key_pem, ca.cert_pem)
    assert tls.ready and tls.info is not None and tls.info.serial == a.cert.serial_number
    before, reader, writer = await peer(port, ctx)
    assert before == a.cert

    assert tls.load(b.cert_pem, b.key_pem, ca.cert_pem)
    assert tls.generation == 2 and tls.info.serial == b.cert.serial_number
    for host in ("127.0.0.1", NAMES[0]):  # without SNI (an IP) and with it
        assert await peer_cert(port, ctx, host) == b.cert
    # The connection made before the reload is untouched and still works.
    writer.write(b"still here\n")
    assert await reader.readline() == b"still here\n"
    assert writer.get_extra_info("ssl_object").getpeercert(binary_form=True) == a.cert.public_bytes(
        pki.serialization.Encoding.DER
    )
    writer.close()


async def test_reload_across_a_ca_change_with_a_bundle_of_both(server) -> None:
    tls, port = server
    old, new = new_ca(), new_ca()
    a, b = issue(old), issue(new)
    both = client_context(old.cert_pem, new.cert_pem)
    tls.load(a.cert_pem, a.key_pem)
    assert await peer_cert(port, both) == a.cert
    tls.load(b.cert_pem, b.key_pem)
    assert await peer_cert(port, both) == b.cert
    with pytest.raises(ssl.SSLCertVerificationError):
        await peer_cert(port, client_context(old.cert_pem))


async def test_a_change_of_key_type_never_serves_the_old_certificate(server) -> None:
    """OpenSSL keeps one certificate per key type in a context: an RSA certificate loaded before an
    ECDSA one would otherwise stay servable to clients that prefer RSA."""
    tls, port = server
    rsa_ca = rsa_pki.make_ca("rsa-ca", use_rsa=True)
    rsa_leaf = rsa_pki.issue(
        rsa_ca, "svc", dns_names=NAMES, ips=("127.0.0.1",), server=True, use_rsa=True
    )
    ec_ca = new_ca()
    ec_leaf = issue(ec_ca)
    tls.load(rsa_leaf.cert_pem, rsa_leaf.key_pem)
    tls.load(ec_leaf.cert_pem, ec_leaf.key_pem)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        ctx = client_context(ec_ca.cert_pem, rsa_ca.cert_pem, max_version=version)
        assert await peer_cert(port, ctx) == ec_leaf.cert
    # A TLS 1.2 client that can only do RSA gets no certificate at all, not the stale RSA one.
    rsa_only = client_context(ec_ca.cert_pem, rsa_ca.cert_pem, max_version=ssl.TLSVersion.TLSv1_2)
    rsa_only.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await peer_cert(port, rsa_only)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
async def test_tls_1_1_is_refused(server) -> None:
    tls, port = server
    ca = new_ca()
    a = issue(ca)
    tls.load(a.cert_pem, a.key_pem)
    ctx = client_context(ca.cert_pem, max_version=ssl.TLSVersion.TLSv1_1)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await peer_cert(port, ctx)
    ok = client_context(ca.cert_pem, max_version=ssl.TLSVersion.TLSv1_2)
    assert await peer_cert(port, ok) == a.cert


async def test_a_bad_pair_is_rejected_and_the_old_certificate_stays(server) -> None:
    tls, port = server
    ca = new_ca()
    a, b = issue(ca), issue(ca)
    tls.load(a.cert_pem, a.key_pem)
    with pytest.raises(pki.CertificateError):
        tls.load(b.cert_pem, a.key_pem)
    with pytest.raises(pki.CertificateError):
        tls.load(b"junk", a.key_pem)
    assert tls.generation == 1 and tls.info is not None
    assert tls.info.serial == a.cert.serial_number
    assert await peer_cert(port, client_context(ca.cert_pem)) == a.cert
    assert tls.load(a.cert_pem, a.key_pem) is False, "the same certificate is no change"


async def test_change_notification_by_event_and_listener() -> None:
    seen: list[int] = []
    tls = ServingTLS(on_change=lambda info: seen.append(info.serial))
    tls.add_listener(lambda info: 1 / 0)  # a failing listener does not stop the others
    later: list[int] = []
    tls.add_listener(lambda info: later.append(info.serial))
    ca = new_ca()
    a, b = issue(ca), issue(ca)
    waiter = asyncio.create_task(tls.wait_ready())
    await asyncio.sleep(0)
    tls.load(a.cert_pem, a.key_pem)
    assert (await asyncio.wait_for(waiter, 1)).serial == a.cert.serial_number
    assert (await tls.wait_ready()).serial == a.cert.serial_number  # returns at once
    waiter = asyncio.create_task(tls.wait_changed())
    await asyncio.sleep(0)
    assert not waiter.done()
    tls.load(b.cert_pem, b.key_pem)
    assert (await asyncio.wait_for(waiter, 1)).serial == b.cert.serial_number
    assert seen == later == [a.cert.serial_number, b.cert.serial_number]
