"""X.509, in one place: keys, CAs, the certificates they sign, self-signed ones, parsing and the
checks certificate rotation needs (cryptography).

`certificate` builds every certificate, whatever its shape (CA, serving, client, self-signed);
`make_ca`, `issue_serving` and `self_signed` are the shapes the library's own servers use (the
admission webhook's self-managed CA and serving certificates, /metrics' fallback certificate), and
hack/localcluster builds its control plane's certificates with it too.

Pure functions over PEM bytes and `cryptography` objects; no I/O and no clock of their own (every
function that depends on time takes `now`; `self_signed` reads the clock when not given one), so
the renewal rules are testable at any age.

Keys are ECDSA P-256 unless asked for RSA: generated in microseconds, accepted by the API server's
Go TLS client and by every TLS 1.2+ client, and a signature is a fraction of an RSA one's cost on
the admission path.
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
# How far back a certificate's validity starts: clocks of its peers may lag ours a little.
BACKDATE = dt.timedelta(minutes=5)


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


def new_key(*, rsa_bits: int | None = None) -> PrivateKey:
    """An ECDSA P-256 key, or an RSA key of `rsa_bits` for a peer that needs RSA."""
    if rsa_bits:
        return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    """PKCS#8 PEM; an RSA key as PKCS#1 ("RSA PRIVATE KEY"), the form some Go parsers (the
    training-operator's certificate rotator) accept alone."""
    fmt = (
        serialization.PrivateFormat.TraditionalOpenSSL
        if isinstance(key, rsa.RSAPrivateKey)
        else serialization.PrivateFormat.PKCS8
    )
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def subject_name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


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


def certificate(
    subject: x509.Name,
    *,
    now: dt.datetime,
    validity: dt.timedelta,
    backdate: dt.timedelta = BACKDATE,
    issuer: KeyPair | None = None,
    ca: bool | None = None,
    path_length: int | None = None,
    key_usage: bool = False,
    extended_usages: Sequence[x509.ObjectIdentifier] | None = None,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    subject_key_id: bool = False,
    rsa_bits: int | None = None,
) -> KeyPair:
    """A new key and a certificate for it, valid from `now - backdate` to `now + validity` but
    never beyond its issuer; self-signed when `issuer` is None.

    Extensions, each only when asked for: BasicConstraints (`ca` True or False, critical, with
    `path_length`), KeyUsage (`key_usage`: digital signature, and certificate and CRL signing for
    a CA; critical), ExtendedKeyUsage (`extended_usages`), SubjectAlternativeName (when there are
    `dns_names` or `ip_addresses`), SubjectKeyIdentifier (`subject_key_id`), and the
    AuthorityKeyIdentifier of the issuer's key whenever there is an issuer.
    """
    key = new_key(rsa_bits=rsa_bits)
    not_before, not_after = now - backdate, now + validity
    if issuer is None:
        issuer_name, signing_key, issuer_cert = subject, key, None
    else:
        issuer_cert = x509.load_pem_x509_certificate(issuer.cert_pem)
        issuer_name, signing_key = issuer_cert.subject, load_private_key(issuer.key_pem)
        not_before = max(not_before, issuer_cert.not_valid_before_utc)
        not_after = min(not_after, issuer_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    if ca is not None:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=ca, path_length=path_length if ca else None), critical=True
        )
    if key_usage:
        builder = builder.add_extension(_key_usage(cert_sign=bool(ca)), critical=True)
    if extended_usages is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(extended_usages), critical=False)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if issuer_cert is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_cert.public_key()),
            critical=False,
        )
    if subject_key_id:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    return KeyPair(cert_pem(builder.sign(signing_key, hashes.SHA256())), key_pem(key))


def make_ca(
    common_name: str, *, now: dt.datetime, validity: dt.timedelta, backdate: dt.timedelta
) -> KeyPair:
    """A self-signed CA valid from `now - backdate` to `now + validity`, signing leaves only
    (path length 0).

    The subject carries the issue time and a random tag (`<cn>@<unix seconds>-<hex>`, after
    client-go's self-signed CAs), so the old and the new CA of a rotation never share a name.
    """
    cn = f"{common_name}@{int(now.timestamp())}-{os.urandom(3).hex()}"
    return certificate(
        subject_name(cn),
        now=now,
        validity=validity,
        backdate=backdate,
        ca=True,
        path_length=0,
        key_usage=True,
        subject_key_id=True,
    )


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
    cn = dns_names[0] if dns_names else ip_addresses[0]
    return certificate(
        subject_name(cn[:64]),
        now=now,
        validity=validity,
        backdate=backdate,
        issuer=ca,
        ca=False,
        key_usage=True,
        extended_usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        subject_key_id=True,
    )


def self_signed(
    hosts: Sequence[str],
    *,
    now: dt.datetime | None = None,
    validity: dt.timedelta = dt.timedelta(days=365),
) -> tuple[bytes, bytes]:
    """A self-signed certificate for `hosts` (DNS names or IPs) and its key, PEM: what a server
    serves when it was given no certificate (controller-runtime's /metrics does the same)."""
    dns: list[str] = []
    ips: list[str] = []
    for h in hosts:
        try:
            ipaddress.ip_address(h)
        except ValueError:
            dns.append(h)
        else:
            ips.append(h)
    pair = certificate(
        subject_name(hosts[0]),
        now=now or dt.datetime.now(dt.UTC),
        validity=validity,
        dns_names=dns,
        ip_addresses=ips,
    )
    return pair.cert_pem, pair.key_pem


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
