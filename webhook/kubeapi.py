"""A minimal asyncio API-server client for certificate management (aiohttp, nothing else).

It implements `webhook.certs_store.SecretStore` and nothing more: get/create/update one Secret and
get/patch one MutatingWebhookConfiguration. It exists so certificate management did not wait for the
reconciler library's client; when that client lands, replace this module with a thin adapter that
provides the same five methods, and delete it. Keep it that small until then.

Credentials: a kubeconfig (read by the `kubernetes` package's `KubeConfigLoader`: client
certificates, bearer tokens, exec plugins and their refresh), or the in-cluster service account
(the token file is re-read when it changes, as the kubelet rotates it).
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from .certs_store import Conflict, StoreError

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


class _TokenFile:
    """A bearer token read from a file, re-read whenever the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = ""

    def __call__(self) -> str | None:
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp != self._stamp:
            self._token = self.path.read_text().strip()
            self._stamp = stamp
        return f"Bearer {self._token}"


class KubeAPI:
    """Implements `SecretStore` against `server` (an https URL).

    `authorization` returns the Authorization header value for each request (None: none, e.g.
    client-certificate authentication configured in `ssl_context`).
    """

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext,
        *,
        authorization: Callable[[], str | None] = lambda: None,
        tls_server_name: str | None = None,
        timeout: float = 10.0,
        field_manager: str = "kubeckpt-webhook",
    ) -> None:
        self.server = server.rstrip("/")
        self.ssl_context = ssl_context
        self.authorization = authorization
        self.tls_server_name = tls_server_name
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.field_manager = field_manager
        self._session: aiohttp.ClientSession | None = None

    # --- construction ---
    @classmethod
    def from_kubeconfig(
        cls, path: str | os.PathLike[str] | None = None, context: str | None = None
    ) -> KubeAPI:
        """From a kubeconfig file (default: $KUBECONFIG's first file, else ~/.kube/config)."""
        from kubernetes.client import Configuration
        from kubernetes.config.kube_config import KubeConfigLoader

        if path is None:
            env = os.environ.get("KUBECONFIG", "")
            path = env.split(os.pathsep)[0] if env else Path.home() / ".kube" / "config"
        path = Path(path)
        loader = KubeConfigLoader(
            config_dict=yaml.safe_load(path.read_text()),
            active_context=context,
            config_base_path=str(path.parent),
        )
        cfg = Configuration()
        loader.load_and_set(cfg)
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)

        def authorization() -> str | None:
            if cfg.refresh_api_key_hook is not None:
                cfg.refresh_api_key_hook(cfg)
            return cfg.api_key.get("BearerToken") or cfg.api_key.get("authorization")

        return cls(
            cfg.host,
            ctx,
            authorization=authorization,
            tls_server_name=getattr(cfg, "tls_server_name", None) or None,
        )

    @classmethod
    def in_cluster(cls, sa_dir: Path = SA_DIR) -> KubeAPI:
        """From the pod's service account and KUBERNETES_SERVICE_HOST/PORT."""
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"
        ctx = ssl.create_default_context(cafile=str(sa_dir / "ca.crt"))
        return cls(f"https://{host}:{port}", ctx, authorization=_TokenFile(sa_dir / "token"))

    @classmethod
    def from_environment(cls, kubeconfig: str | os.PathLike[str] | None = None) -> KubeAPI:
        """`kubeconfig` if given, else in-cluster when running in a pod, else the default one."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster()
        return cls.from_kubeconfig(kubeconfig)

    # --- transport ---
    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """One API call: (HTTP status, decoded JSON body). Raises StoreError only when the server
        could not be reached or did not answer JSON."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ssl_context), timeout=self.timeout
            )
        headers = {"Accept": "application/json"}
        auth = self.authorization()
        if auth:
            headers["Authorization"] = auth
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        extra: dict[str, Any] = {}
        if self.tls_server_name:
            extra["server_hostname"] = self.tls_server_name
        try:
            async with self._session.request(
                method, self.server + path, data=data, headers=headers, params=params, **extra
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise StoreError(f"{method} {path}: {type(e).__name__}: {e}") from e
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError as e:
            raise StoreError(
                f"{method} {path}: HTTP {status}, not JSON: {raw[:200]!r}", status
            ) from e
        return status, decoded if isinstance(decoded, dict) else {"value": decoded}

    async def _call(
        self, method: str, path: str, body: Any = None, **kw: Any
    ) -> dict[str, Any] | None:
        status, obj = await self.request(method, path, body, **kw)
        if status == 404 and method == "GET":
            return None
        if 200 <= status < 300:
            return obj
        message = f"{method} {path}: HTTP {status}: {obj.get('message') or obj}"
        if status in (404, 409):
            raise Conflict(message, status)
        raise StoreError(message, status)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeAPI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- SecretStore ---
    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call("GET", _secret_path(namespace, name))

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{quote(namespace)}/secrets"
        obj = await self._call("POST", path, body, params=self._write_params())
        assert obj is not None
        return obj

    async def update_secret(
        self, namespace: str, name: str, body: dict[str, Any], *, resource_version: str
    ) -> dict[str, Any]:
        body = {
            **body,
            "metadata": {**body.get("metadata", {}), "resourceVersion": resource_version},
        }
        obj = await self._call(
            "PUT", _secret_path(namespace, name), body, params=self._write_params()
        )
        assert obj is not None
        return obj

    async def get_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        return await self._call("GET", f"{MWC_PATH}/{quote(name)}")

    async def patch_webhook_configuration(
        self, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        path = f"{MWC_PATH}/{quote(name)}"
        try:
            obj = await self._call(
                "PATCH",
                path,
                patch,
                content_type="application/json-patch+json",
                params=self._write_params(),
            )
        except StoreError as e:
            # A failed `test` operation comes back as a bare 422 Invalid, like a real validation
            # error. Tell them apart by checking the tests against the object as it is now.
            if e.status != 422 or not any(op.get("op") == "test" for op in patch):
                raise
            current = await self._call("GET", path)
            if current is None or not all(_test_holds(current, op) for op in patch):
                raise Conflict(f"{e} (a test operation failed)", 422) from e
            raise
        assert obj is not None
        return obj

    def _write_params(self) -> dict[str, str]:
        return {"fieldManager": self.field_manager}


def _secret_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}"


def _test_holds(obj: Any, op: dict[str, Any]) -> bool:
    """Whether an RFC 6902 operation, if it is a `test`, holds for `obj` (other ops: True)."""
    if op.get("op") != "test":
        return True
    for token in str(op["path"]).split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(obj, dict) and token in obj:
            obj = obj[token]
        elif isinstance(obj, list) and token.isdigit() and int(token) < len(obj):
            obj = obj[int(token)]
        else:
            return False
    return obj == op.get("value")
