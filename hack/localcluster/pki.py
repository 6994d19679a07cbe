"""Certificates for the local control plane, made by the reconciler library's one X.509 builder
(reconciler.pki; no openssl, no cfssl), written as `<name>.crt`/`<name>.key` pairs.

ECDSA P-256 keys: generating them takes microseconds, which keeps a warm start well under budget.
RSA where a peer needs it (the training-operator's certificate rotator).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from reconciler import pki

VALIDITY = dt.timedelta(days=365)
RSA_BITS = 2048


class KeyPair(pki.KeyPair):
    """A certificate and its key, PEM, kept as files in the cluster's certificate directory."""

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        crt, key = directory / f"{name}.crt", directory / f"{name}.key"
        crt.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return crt, key

    @classmethod
    def read(cls, directory: Path, name: str) -> KeyPair:
        return cls(
            (directory / f"{name}.crt").read_bytes(), (directory / f"{name}.key").read_bytes()
        )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(cn: str, dns_names: tuple[str, ...] = (), *, use_rsa: bool = False) -> KeyPair:
    # Some verifiers (the training-operator's cert rotator) check the CA against a DNS name.
    pair = pki.certificate(
        pki.subject_name(cn),
        now=_now(),
        validity=VALIDITY,
        ca=True,
        key_usage=True,
        dns_names=dns_names,
        subject_key_id=True,
        rsa_bits=RSA_BITS if use_rsa else None,
    )
    return KeyPair(pair.cert_pem, pair.key_pem)


def issue(
    ca: pki.KeyPair,
    cn: str,
    *,
    orgs: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
    use_rsa: bool = False,
) -> KeyPair:
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    pair = pki.certificate(
        pki.subject_name(cn, orgs),
        now=_now(),
        validity=VALIDITY,
        issuer=ca,
        ca=False,
        extended_usages=usages,
        dns_names=dns_names,
        ip_addresses=ips,
        rsa_bits=RSA_BITS if use_rsa else None,
    )
    return KeyPair(pair.cert_pem, pair.key_pem)


def service_account_keys() -> tuple[bytes, bytes]:
    """The key pair the API server signs service-account tokens with (ES256)."""
    key = pki.new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pki.key_pem(key), public
