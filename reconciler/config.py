"""Where the API server is and how to authenticate: from a kubeconfig (parsed by the `kubernetes`
package's loader, so contexts, inline data and exec plugins work as in kubectl) or from the pod's
service account (in-cluster)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .auth import FileToken, KubeconfigToken, StaticToken, TokenSource

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass
class ClientConfig:
    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    verify: bool = True
    tls_server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: TokenSource | None = None
    namespace: str = "default"
    # controller-runtime's defaults; None disables client-side throttling.
    qps: float | None = 20.0
    burst: int = 30
    timeout: float = 30.0
    connect_timeout: float = 10.0
    max_retries: int = 5
    max_retry_wait: float = 60.0
    max_connections: int = 100
    user_agent: str = "kubeckpt-reconciler/0.1"
    extra: dict[str, Any] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https"):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def load_kubeconfig(
    path: str | os.PathLike[str] | None = None, context: str | None = None
) -> ClientConfig:
    """Load a kubeconfig ($KUBECONFIG or ~/.kube/config when `path` is None)."""
    from kubernetes import client as k8s_client
    from kubernetes.config import kube_config

    if path is None:
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser(
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION
        )
    cfg = k8s_client.Configuration()
    kube_config.load_kube_config(
        config_file=str(path), context=context, client_configuration=cfg, persist_config=False
    )
    raw = yaml.safe_load(Path(path).read_text()) or {}
    ctx_name = context or raw.get("current-context")
    ctx = next((c["context"] for c in raw.get("contexts", []) if c["name"] == ctx_name), {})
    user = next((u["user"] for u in raw.get("users", []) if u["name"] == ctx.get("user")), {})
    token: TokenSource | None = None
    if user.get("tokenFile"):
        # Re-read on rotation; the kubernetes loader reads it once.
        token = FileToken(Path(path).parent / user["tokenFile"])
    elif cfg.api_key.get("BearerToken") or cfg.api_key.get("authorization"):
        token = KubeconfigToken(cfg)
    return ClientConfig(
        server=cfg.host,
        ca_file=cfg.ssl_ca_cert,
        verify=bool(cfg.verify_ssl),
        tls_server_name=getattr(cfg, "tls_server_name", None),
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        token=token,
        namespace=ctx.get("namespace") or "default",
    )


def load_incluster(
    sa_dir: str | os.PathLike[str] = SERVICE_ACCOUNT_DIR, env: Mapping[str, str] | None = None
) -> ClientConfig:
    """The pod's service account: $KUBERNETES_SERVICE_HOST/PORT, token (re-read when the kubelet
    rotates it), CA and namespace from `sa_dir`."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise RuntimeError("not in a cluster: KUBERNETES_SERVICE_HOST/PORT are unset")
    sa = Path(sa_dir)
    if not (sa / "token").exists():
        raise RuntimeError(f"no service-account token at {sa / 'token'}")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ns_file = sa / "namespace"
    return ClientConfig(
        server=f"https://{host}:{port}",
        ca_file=str(sa / "ca.crt"),
        token=FileToken(sa / "token"),
        namespace=ns_file.read_text().strip() if ns_file.exists() else "default",
    )


def load_config(
    path: str | os.PathLike[str] | None = None, context: str | None = None
) -> ClientConfig:
    """In-cluster when running in a pod (and no kubeconfig was named), else the kubeconfig."""
    if path is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        if (SERVICE_ACCOUNT_DIR / "token").exists():
            return load_incluster()
    return load_kubeconfig(path, context)


__all__ = [
    "ClientConfig",
    "FileToken",
    "StaticToken",
    "load_config",
    "load_incluster",
    "load_kubeconfig",
]
