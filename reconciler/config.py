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
    # True: `qps` is a ceiling, halved on each 429 (APF shedding load) and recovered additively
    # (ratelimit.AimdRate); False: a fixed rate, as client-go's.
    adaptive_qps: bool = False
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


def kubeconfig_files(value: str | os.PathLike[str] | None = None) -> list[Path]:
    """The kubeconfig files to merge, as kubectl finds them: `value` (one path, or several joined
    by os.pathsep as in $KUBECONFIG), else $KUBECONFIG, else ~/.kube/config. Files of a list that
    do not exist are skipped, as kubectl does; a single named file is kept (its load says why)."""
    text = os.fspath(value) if value is not None else os.environ.get("KUBECONFIG", "")
    paths = [Path(p).expanduser() for p in text.split(os.pathsep) if p]
    if not paths:
        # Not kubernetes' KUBE_CONFIG_DEFAULT_LOCATION: that is $KUBECONFIG as it was at import.
        return [Path("~/.kube/config").expanduser()]
    existing = [p for p in paths if p.exists()]
    return existing or paths[:1]


def _merged(files: list[Path]) -> dict[str, Any]:
    """kubectl's merge of several kubeconfigs: the first file that names a context, cluster or
    user wins it; current-context is the first one set. Each entry keeps its file's directory
    (relative paths in it are relative to that file)."""
    out: dict[str, Any] = {"current-context": None, "contexts": {}, "users": {}}
    for f in files:
        raw = yaml.safe_load(f.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{f}: not a kubeconfig (a YAML mapping)")
        out["current-context"] = out["current-context"] or raw.get("current-context")
        for section, key in (("contexts", "context"), ("users", "user")):
            for item in raw.get(section) or []:
                if isinstance(item, dict) and item.get("name"):
                    out[section].setdefault(item["name"], (item.get(key) or {}, f.parent))
    return out


def load_kubeconfig(
    path: str | os.PathLike[str] | None = None, context: str | None = None
) -> ClientConfig:
    """Load a kubeconfig: `path` (one file or an os.pathsep-joined list), else $KUBECONFIG (all
    of its files, merged as kubectl merges them), else ~/.kube/config."""
    from kubernetes import client as k8s_client
    from kubernetes.config import kube_config

    files = kubeconfig_files(path)
    merged = _merged([f for f in files if f.exists()])
    ctx_name = context or merged["current-context"]
    cfg = k8s_client.Configuration()
    kube_config.load_kube_config(
        config_file=os.pathsep.join(str(f) for f in files),
        context=ctx_name,
        client_configuration=cfg,
        persist_config=False,
    )
    ctx = merged["contexts"].get(ctx_name, ({}, None))[0]
    user, user_dir = merged["users"].get(ctx.get("user"), ({}, None))
    token: TokenSource | None = None
    if user.get("tokenFile"):
        # Re-read on rotation; the kubernetes loader reads it once.
        token = FileToken(Path(user_dir or ".") / user["tokenFile"])
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
