"""The self-managed CA and serving certificates verify as a TLS client would verify them."""

from __future__ import annotations

import datetime as dt
import ipaddress

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import (
    DNSName,
    IPAddress,
    PolicyBuilder,
    Store,
    VerificationError,
)

from reconciler import pki

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
SKEW = dt.timedelta(minutes=5)
NAMES = ("svc.ns.svc", "svc.ns.svc.cluster.local")


def make_pair(
    *, ca_validity: dt.timedelta = 365 * DAY, validity: dt.timedelta = 90 * DAY
) -> tuple[pki.KeyPair, pki.KeyPair]:
    ca = pki.make_ca("test-ca", now=NOW, validity=ca_validity, backdate=SKEW)
    leaf = pki.issue_serving(
        ca, dns_names=NAMES, ip_addresses=("127.0.0.1",), now=NOW, validity=validity, backdate=SKEW
    )
    return ca, leaf


def verify(ca: pki.KeyPair, leaf: pki.KeyPair, name: x509.verification.Subject, at=NOW):
    verifier = PolicyBuilder().store(Store([ca.cert])).time(at).build_server_verifier(name)
    return verifier.verify(leaf.cert, [])


def test_ca_is_a_self_signed_ca_with_cert_sign_usage_and_validity() -> None:
    ca, _ = make_pair()
    cert = ca.cert
    assert pki.is_ca(cert)
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign
    assert cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert pki.issued_by(cert, cert), "self-signed"
    assert cert.not_valid_before_utc == NOW - SKEW
    assert cert.not_valid_after_utc == NOW + 365 * DAY
    assert pki.key_matches(cert, pki.load_private_key(ca.key_pem))


def test_two_cas_made_in_the_same_second_have_different_names() -> None:
    a = pki.make_ca("x", now=NOW, validity=DAY, backdate=SKEW).cert
    b = pki.make_ca("x", now=NOW, validity=DAY, backdate=SKEW).cert
    assert a.subject != b.subject


def test_serving_certificate_chain_sans_usages_and_validity() -> None:
    ca, leaf = make_pair()
    cert = leaf.cert
    assert not pki.is_ca(cert)
    assert pki.issued_by(cert, ca.cert)
    dns, ips = pki.sans_of(cert)
    assert dns == set(NAMES) and ips == {"127.0.0.1"}
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and not ku.key_cert_sign
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert cert.not_valid_before_utc == NOW - SKEW
    assert cert.not_valid_after_utc == NOW + 90 * DAY
    pki.check_pair(leaf.cert_pem, leaf.key_pem)
    # The strict RFC 5280 / CA/B-style verifier accepts the chain for each name it serves.
    for name in (
        DNSName(NAMES[0]),
        DNSName(NAMES[1]),
        IPAddress(ipaddress.ip_address("127.0.0.1")),
    ):
        chain = verify(ca, leaf, name)
        assert chain[-1] == ca.cert


def test_serving_certificate_is_rejected_for_other_names_other_cas_and_outside_validity() -> None:
    ca, leaf = make_pair()
    other_ca, _ = make_pair()
    with pytest.raises(VerificationError):
        verify(ca, leaf, DNSName("svc.other.svc"))
    with pytest.raises(VerificationError):
        verify(other_ca, leaf, DNSName(NAMES[0]))
    with pytest.raises(VerificationError):
        verify(ca, leaf, DNSName(NAMES[0]), at=NOW + 91 * DAY)


def test_serving_certificate_never_outlives_its_ca() -> None:
    ca, leaf = make_pair(ca_validity=30 * DAY, validity=90 * DAY)
    assert leaf.cert.not_valid_after_utc == ca.cert.not_valid_after_utc


def test_key_mismatch_and_garbage_are_certificate_errors() -> None:
    _, a = make_pair()
    _, b = make_pair()
    with pytest.raises(pki.CertificateError, match="does not match"):
        pki.check_pair(a.cert_pem, b.key_pem)
    with pytest.raises(pki.CertificateError):
        pki.check_pair(b"junk", a.key_pem)
    with pytest.raises(pki.CertificateError):
        pki.load_private_key(b"junk")
    assert pki.load_certs(b"") == []


@pytest.mark.parametrize(
    ("age_days", "due"),
    [(0, False), (30, False), (59, False), (60.1, True), (89, True), (90, True), (120, True)],
)
def test_renewal_is_due_when_less_than_a_third_of_the_lifetime_remains(
    age_days: float, due: bool
) -> None:
    ca = pki.make_ca("ca", now=NOW, validity=365 * DAY, backdate=dt.timedelta(0))
    leaf = pki.issue_serving(
        ca, dns_names=NAMES, now=NOW, validity=90 * DAY, backdate=dt.timedelta(0)
    ).cert
    assert pki.renewal_due(leaf, NOW + dt.timedelta(days=age_days), 1 / 3) is due
    assert pki.renewal_time(leaf, 1 / 3) == NOW + 60 * DAY


def test_renewal_fraction_is_configurable() -> None:
    ca = pki.make_ca("ca", now=NOW, validity=365 * DAY, backdate=dt.timedelta(0))
    leaf = pki.issue_serving(
        ca, dns_names=NAMES, now=NOW, validity=100 * DAY, backdate=dt.timedelta(0)
    ).cert
    assert not pki.renewal_due(leaf, NOW + 49 * DAY, 0.5)
    assert pki.renewal_due(leaf, NOW + 51 * DAY, 0.5)
    assert not pki.renewal_due(leaf, NOW + 89 * DAY, 0.1)
    assert pki.renewal_due(leaf, NOW + 91 * DAY, 0.1)
