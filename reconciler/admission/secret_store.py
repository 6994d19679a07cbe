"""The few API-server operations certificate management needs, as a protocol.

`api_store.ClientSecretStore` implements it on the library's client. Tests use an in-memory fake.
"""

from __future__ import annotations

from typing import Any, Protocol


class StoreError(Exception):
    """An API call failed (status is the HTTP status, 0 when the server was not reached)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Conflict(StoreError):
    """A write's precondition failed: 409 (AlreadyExists, or a stale resourceVersion), a JSON
    patch `test` operation that did not hold, or the object vanished before the update. The caller
    re-reads and decides again; it never retries the same write blindly."""


class SecretStore(Protocol):
    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or None when it does not exist."""
        ...

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create it; Conflict when it already exists (another replica created it first)."""
        ...

    async def update_secret(
        self, namespace: str, name: str, body: dict[str, Any], *, resource_version: str
    ) -> dict[str, Any]:
        """Replace it only if it is still at `resource_version`; Conflict otherwise."""
        ...

    async def get_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        """The MutatingWebhookConfiguration (cluster-scoped), or None when it does not exist."""
        ...

    async def patch_webhook_configuration(
        self, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Apply an RFC 6902 JSON patch; Conflict when one of its `test` operations fails."""
        ...
