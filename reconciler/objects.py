"""Small helpers over objects as the API returns them (plain dicts, never typed models: any CRD
works, and nothing is converted twice)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

KubeObject = dict[str, Any]


def meta(obj: KubeObject) -> dict[str, Any]:
    return obj.get("metadata") or {}


def name_of(obj: KubeObject) -> str:
    return str(meta(obj).get("name", ""))


def namespace_of(obj: KubeObject) -> str:
    return str(meta(obj).get("namespace") or "")


def resource_version(obj: KubeObject) -> str:
    return str(meta(obj).get("resourceVersion", ""))


def object_key(obj: KubeObject) -> str:
    """client-go's MetaNamespaceKeyFunc: "namespace/name", or "name" when cluster-scoped."""
    ns, name = namespace_of(obj), name_of(obj)
    return f"{ns}/{name}" if ns else name


def split_key(key: str) -> tuple[str, str]:
    """(namespace, name) of a key made by `object_key` (namespace "" when cluster-scoped)."""
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else ("", ns)


def rfc3339(t: datetime | None = None) -> str:
    """metav1.Time: seconds precision, UTC."""
    return (t or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: datetime | None = None) -> str:
    """metav1.MicroTime: microsecond precision, UTC."""
    return (t or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> datetime:
    """Parse a metav1.Time or MicroTime."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
