"""Certificates for the webhook's TLS server (see `manager` for the design).

pki            issuing and checking CA and serving certificates (cryptography)
serving_tls    ServingTLS: the server's hot-reloaded ssl.SSLContext and readiness
manager        CertManager: self-managed CA + serving certificate in a Secret, caBundle, renewal
mounted_files  FileCertSource: cert-manager's mounted tls.crt/tls.key, reloaded on change
store          SecretStore: the API operations the manager needs, as a protocol
api_store      ClientSecretStore: that protocol on the reconciler library's client
"""

from reconciler.pki import CertificateError, CertInfo, KeyPair

from .api_store import ClientSecretStore
from .manager import (
    CA_BUNDLE,
    CA_KEY,
    CA_NEXT_KEY,
    TLS_CERT,
    TLS_KEY,
    CertConfig,
    CertManager,
    Plan,
    ReconcileResult,
    decode_secret_data,
    plan_secret,
)
from .mounted_files import FileCertSource
from .serving_tls import ServingTLS
from .store import Conflict, SecretStore, StoreError

__all__ = [
    "CA_BUNDLE",
    "CA_KEY",
    "CA_NEXT_KEY",
    "TLS_CERT",
    "TLS_KEY",
    "CertConfig",
    "CertInfo",
    "CertManager",
    "CertificateError",
    "ClientSecretStore",
    "Conflict",
    "FileCertSource",
    "KeyPair",
    "Plan",
    "ReconcileResult",
    "SecretStore",
    "ServingTLS",
    "StoreError",
    "decode_secret_data",
    "plan_secret",
]
