"""Typed errors for API responses, so callers write `except NotFound` instead of testing codes.

The class follows the HTTP status, refined by the Status `reason` where Kubernetes distinguishes
cases with one code (409 AlreadyExists vs Conflict, 410 Expired vs Gone).
"""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """Base of every error this library raises."""


class TransportError(KubeError):
    """The request did not produce an HTTP response (connection refused or reset, TLS, timeout)."""


class ResourceNotFound(KubeError):
    """Discovery does not know the requested kind or resource."""


class ApiError(KubeError):
    """An HTTP error status from the API server, with its Status object when it sent one."""

    status: int

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}
        self.retry_after = retry_after
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")

    @property
    def details(self) -> dict[str, Any]:
        return self.body.get("details") or {}

    @property
    def causes(self) -> list[dict[str, Any]]:
        return list(self.details.get("causes") or [])


class BadRequest(ApiError):
    """400"""


class Unauthorized(ApiError):
    """401: no or invalid credentials"""


class Forbidden(ApiError):
    """403: authenticated, but RBAC (or admission) denies it"""


class NotFound(ApiError):
    """404"""


class MethodNotAllowed(ApiError):
    """405"""


class Conflict(ApiError):
    """409: optimistic-concurrency or server-side-apply field conflict"""

    @property
    def field_conflicts(self) -> list[tuple[str, str]]:
        """(field, message) for each server-side-apply conflict, e.g. ('.status.step',
        'conflict with "other" using kubeckpt.io/v1alpha1')."""
        return [
            (c.get("field", ""), c.get("message", ""))
            for c in self.causes
            if c.get("reason") == "FieldManagerConflict"
        ]


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists"""


class Gone(ApiError):
    """410: the resourceVersion (or continue token) is older than the server keeps"""


class Invalid(ApiError):
    """422: validation failed"""


class TooManyRequests(ApiError):
    """429"""


class ServerError(ApiError):
    """5xx"""


class ServiceUnavailable(ServerError):
    """503"""


class ServerTimeout(ServerError):
    """504"""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
    503: ServiceUnavailable,
    504: ServerTimeout,
}


def api_error(
    status: int, body: bytes | str | dict[str, Any] | None, retry_after: float | None = None
) -> ApiError:
    """Build the typed error for an HTTP status and the response body (a Status, if any)."""
    status_obj: dict[str, Any] = {}
    text = ""
    if isinstance(body, dict):
        status_obj = body
    elif body:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            parsed = json.loads(text)
            if isinstance(parsed, dict):
                status_obj = parsed
        except ValueError:
            pass
    reason = str(status_obj.get("reason", ""))
    message = str(status_obj.get("message", "")) or text[:500]
    cls = _BY_STATUS.get(status)
    if status == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    elif cls is None:
        cls = ServerError if status >= 500 else ApiError
    return cls(status, reason, message, status_obj, retry_after)
