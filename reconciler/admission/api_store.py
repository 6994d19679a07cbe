"""SecretStore on the reconciler library's client: the five API operations certificate management
needs, with the library's auth (kubeconfig or rotating service-account token), rate limits and
retries, and its typed errors translated to the store's."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..client import Client
from ..errors import ApiError, KubeError, NotFound
from ..errors import Conflict as ApiConflict
from .secret_store import Conflict, StoreError

MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def _secret_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/secrets"
    return f"{base}/{quote(name)}" if name else base


def patch_test_holds(obj: Any, op: dict[str, Any]) -> bool:
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


class ClientSecretStore:
    """`field_manager` names the writer in the objects' managedFields (the webhook's own name)."""

    def __init__(self, client: Client, *, field_manager: str = "webhook-certs") -> None:
        self.client = client
        self.field_manager = field_manager

    async def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        try:
            return await self.client.request(
                method,
                path,
                json_body=body,
                params={"fieldManager": self.field_manager} if method != "GET" else None,
                **kw,
            )
        except ApiConflict as e:
            raise Conflict(str(e), e.status) from e
        except ApiError as e:
            raise StoreError(str(e), e.status) from e
        except KubeError as e:
            raise StoreError(str(e)) from e

    async def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", path)
        except StoreError as e:
            if isinstance(e.__cause__, NotFound):
                return None
            raise

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(_secret_path(namespace, name))

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", _secret_path(namespace), body)

    async def update_secret(
        self, namespace: str, name: str, body: dict[str, Any], *, resource_version: str
    ) -> dict[str, Any]:
        meta = {**body.get("metadata", {}), "resourceVersion": resource_version}
        try:
            return await self._call(
                "PUT", _secret_path(namespace, name), {**body, "metadata": meta}
            )
        except StoreError as e:
            if isinstance(e.__cause__, NotFound):  # deleted under us: re-read and decide again
                raise Conflict(str(e), 404) from e
            raise

    async def get_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        return await self._get(f"{MWC_PATH}/{quote(name)}")

    async def patch_webhook_configuration(
        self, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        path = f"{MWC_PATH}/{quote(name)}"
        try:
            return await self._call(
                "PATCH", path, patch, content_type="application/json-patch+json"
            )
        except StoreError as e:
            # A failed `test` comes back as a bare 422 Invalid, like a real validation error:
            # tell them apart by checking the tests against the object as it is now.
            if e.status != 422 or not any(op.get("op") == "test" for op in patch):
                raise
            current = await self._get(path)
            if current is None or not all(patch_test_holds(current, op) for op in patch):
                raise Conflict(f"{e} (a test operation failed)", 422) from e
            raise
