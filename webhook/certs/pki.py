"""X.509 for the webhook's self-managed certificates: a CA, serving certificates it signs, parsing.

Pure functions over PEM bytes and `cryptography` objects; no I/O and no clock of their own (every
function that depends on time takes `now`), so the renewal rules are testable at any age.

Keys are ECDSA P-256: generated in microseconds, accepted by the API server's Go TLS client and by
every TLS 1.2+ client, and a signature is a fraction of an RSA one's cost on the admission path.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class CertificateError(ValueError):
    """PEM data that is not a usable certificate, key, or matching pair."""


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True)
class CertInfo:
    """What the server, /readyz, logs and tests want to know about a loaded certificate."""

    serial: int
    fingerprint_sha256: str
    subject: str
    issuer: str
    not_before: dt.datetime
    not_after: dt.datetime
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]

    @classmethod
    def of(cls, cert: x509.Certificate) -> CertInfo:
        dns, ips = sans_of(cert)
        return cls(
            serial=cert.serial_number,
            fingerprint_sha256=fingerprint(cert),
            subject=cert.subject.rfc4514_string(),
            issuer=cert.issuer.rfc4514_string(),
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
            dns_names=tuple(sorted(dns)),
            ip_addresses=tuple(sorted(ips)),
        )


# --- generation ---


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(
    common_name: str, *, now: dt.datetime, validity: dt.timedelta, backdate: dt.timedelta
) -> KeyPair:
    """A self-signed CA valid from `now - backdate` to `now + validity`.

    The subject carries the issue time and a random tag (`<cn>@<unix seconds>-<hex>`, after
    client-go's self-signed CAs), so the old and the new CA of a rotation never share a name.
    """
    key = new_key()
    cn = f"{common_name}@{int(now.timestamp())}-{os.urandom(3).hex()}"
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert_pem(cert), key_pem(key))


def issue_serving(
    ca: KeyPair,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    now: dt.datetime,
    validity: dt.timedelta,
    backdate: dt.timedelta,
) -> KeyPair:
    """A TLS server certificate signed by `ca`, never valid beyond the CA itself.

    Subject CN is the first DNS name (informational: clients check only the SANs).
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = load_private_key(ca.key_pem)
    key = new_key()
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cn = dns_names[0] if dns_names else ip_addresses[0]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - backdate, ca_cert.not_valid_before_utc))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert_pem(cert), key_pem(key))


# --- parsing and checks ---


def load_private_key(pem: bytes) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise CertificateError(f"not a PEM private key: {e}") from e
    if not isinstance(key, PrivateKey):
        raise CertificateError(f"unsupported private key type {type(key).__name__}")
    return key


def load_certs(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM bundle (empty for empty input)."""
    if not pem.strip():
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as e:
        raise CertificateError(f"not a PEM certificate bundle: {e}") from e


def load_cert(pem: bytes) -> x509.Certificate:
    """The first certificate of a PEM chain (the leaf)."""
    certs = load_certs(pem)
    if not certs:
        raise CertificateError("no certificate in PEM data")
    return certs[0]


def bundle_pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(cert_pem(c) for c in certs)


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    return cert.public_key().public_bytes(enc, fmt) == key.public_key().public_bytes(enc, fmt)


def check_pair(cert_chain_pem: bytes, private_key_pem: bytes) -> x509.Certificate:
    """The leaf of a PEM chain, after checking that the key is its key; CertificateError if not."""
    cert = load_cert(cert_chain_pem)
    if not key_matches(cert, load_private_key(private_key_pem)):
        raise CertificateError("private key does not match the certificate")
    return cert


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether `issuer`'s key signed `cert` (names and signature)."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def sans_of(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    """The DNS names and IP addresses (as strings) in the SubjectAlternativeName extension."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    dns = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return dns, ips


def lifetime(cert: x509.Certificate) -> dt.timedelta:
    return cert.not_valid_after_utc - cert.not_valid_before_utc


def remaining(cert: x509.Certificate, now: dt.datetime) -> dt.timedelta:
    return cert.not_valid_after_utc - now


def renewal_due(cert: x509.Certificate, now: dt.datetime, fraction: float) -> bool:
    """True once less than `fraction` of the certificate's lifetime remains (or it has expired)."""
    return remaining(cert, now) < lifetime(cert) * fraction


def renewal_time(cert: x509.Certificate, fraction: float) -> dt.datetime:
    """The moment `renewal_due` becomes true."""
    return cert.not_valid_after_utc - lifetime(cert) * fraction
