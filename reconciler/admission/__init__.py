"""Serving an admission webhook: what controller-runtime's webhook/admission and certwatcher, and
cert-controller's rotator, do for Go operators. Nothing here knows which webhook it serves.

review         AdmissionReview v1 parsing (typed BadReview) and the allowing JSON-patch response
serving_tls    ServingTLS: the server's hot-reloaded ssl.SSLContext and readiness
cert_manager   CertManager: self-managed CA + serving certificate in a Secret, caBundle, renewal
mounted_files  FileCertSource: cert-manager's mounted tls.crt/tls.key, reloaded on change
client_auth    ClientCertAuth, ClientCAFile: the API server authenticated by its client certificate
secret_store   SecretStore: the API operations the manager needs, as a protocol
api_store      ClientSecretStore: that protocol on the library's client

The X.509 itself (CAs, serving certificates, parsing, renewal checks) is reconciler.pki.
"""

from .api_store import ClientSecretStore
from .cert_manager import (
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
from .client_auth import ClientCAFile, ClientCertAuth
from .mounted_files import FileCertSource
from .review import BadReview, is_pod_create, parse_review, review_response
from .secret_store import Conflict, SecretStore, StoreError
from .serving_tls import ServingTLS

__all__ = [
    "CA_BUNDLE",
    "CA_KEY",
    "CA_NEXT_KEY",
    "TLS_CERT",
    "TLS_KEY",
    "BadReview",
    "CertConfig",
    "CertManager",
    "ClientCAFile",
    "ClientCertAuth",
    "ClientSecretStore",
    "Conflict",
    "FileCertSource",
    "Plan",
    "ReconcileResult",
    "SecretStore",
    "ServingTLS",
    "StoreError",
    "decode_secret_data",
    "is_pod_create",
    "parse_review",
    "plan_secret",
    "review_response",
]
