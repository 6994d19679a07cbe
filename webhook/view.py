"""What the webhook knows about the cluster: policies, namespaces and TrainingProgress, read from
informer caches so that no admission request waits on an API call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class ClusterView(Protocol):
    def synced(self) -> bool: ...

    def namespace(self, name: str) -> Mapping[str, Any] | None: ...

    def policies(self, namespace: str) -> list[Mapping[str, Any]]: ...

    def progress(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


class StaticView:
    """A fixed view (for unit tests and the benchmark's in-process handler)."""

    def __init__(
        self,
        namespaces: list[Mapping[str, Any]] = (),  # type: ignore[assignment]
        policies: list[Mapping[str, Any]] = (),  # type: ignore[assignment]
        progress: list[Mapping[str, Any]] = (),  # type: ignore[assignment]
    ) -> None:
        self._ns = {n["metadata"]["name"]: n for n in namespaces}
        self._pol = list(policies)
        self._tp = {(t["metadata"]["namespace"], t["metadata"]["name"]): t for t in progress}

    def synced(self) -> bool:
        return True

    def namespace(self, name: str) -> Mapping[str, Any] | None:
        return self._ns.get(name)

    def policies(self, namespace: str) -> list[Mapping[str, Any]]:
        return [p for p in self._pol if p["metadata"].get("namespace") == namespace]

    def progress(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._tp.get((namespace, name))
