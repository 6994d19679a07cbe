"""Generic access to any resource by (group, version, plural/kind, namespace): paths, verbs,
pagination and watch streams, over plain dicts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .errors import Gone, api_error
from .objects import KubeObject, name_of, namespace_of

PatchType = Literal["merge", "json", "strategic", "apply"]
PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",  # JSON is YAML
}
Params = list[tuple[str, str]]


@dataclass(frozen=True)
class Resource:
    """An API resource as discovery describes it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: frozenset[str] = field(default_factory=frozenset)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
EVENTS = Resource("", "v1", "events", "Event")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod", subresources=frozenset({"exec", "log", "status"}))
SECRETS = Resource("", "v1", "secrets", "Secret")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


@dataclass
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK (ERROR raises instead)
    object: KubeObject


@dataclass
class ListResult:
    items: list[KubeObject]
    resource_version: str
    pages: int = 1
    restarts: int = 0  # lists restarted because a continue token expired (410)


def _selectors(label_selector: str | None, field_selector: str | None) -> Params:
    params: Params = []
    if label_selector:
        params.append(("labelSelector", label_selector))
    if field_selector:
        params.append(("fieldSelector", field_selector))
    return params


class Transport(Protocol):
    """What a ResourceClient needs of the API client (`client.Client` is one): requests that
    return parsed JSON and raise the typed errors, and a watch's stream of lines. A protocol, so
    that this module does not import the client that builds ResourceClients."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        json_body: Any = None,
        data: bytes | None = None,
        content_type: str | None = None,
        request_timeout: float | None = None,
    ) -> Any: ...

    def stream_lines(
        self, path: str, *, params: Params | None = None, read_timeout: float = 300.0
    ) -> AsyncIterator[bytes]: ...


class ResourceClient:
    """Verbs on one resource. `namespace` defaults to the object's own for writes; for a
    namespaced resource, list and watch with namespace None span all namespaces."""

    def __init__(self, client: Transport, resource: Resource) -> None:
        self.client = client
        self.resource = resource

    def __repr__(self) -> str:
        return f"ResourceClient({self.resource.api_version} {self.resource.kind})"

    def _ns(self, namespace: str | None, obj: KubeObject | None = None) -> str | None:
        if not self.resource.namespaced:
            return None
        ns = namespace or (namespace_of(obj) if obj else None)
        if not ns:
            raise ValueError(f"{self.resource.kind} is namespaced: give a namespace")
        return ns

    async def get(
        self, name: str, namespace: str | None = None, *, subresource: str | None = None
    ) -> KubeObject:
        path = self.resource.path(self._ns(namespace), name, subresource)
        return await self.client.request("GET", path)

    async def list(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> KubeObject:
        """One LIST request; the returned List carries `metadata.continue` when there is more."""
        params = _selectors(label_selector, field_selector)
        if limit:
            params.append(("limit", str(limit)))
        if continue_:
            params.append(("continue", continue_))
        if resource_version is not None:
            params.append(("resourceVersion", resource_version))
        if resource_version_match:
            params.append(("resourceVersionMatch", resource_version_match))
        ns = namespace if self.resource.namespaced else None
        return await self.client.request("GET", self.resource.path(ns), params=params)

    async def list_all(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = 500,
        max_restarts: int = 2,
        transform: Callable[[KubeObject], KubeObject] | None = None,
    ) -> ListResult:
        """A consistent LIST in pages of `page_size`. A continue token can expire (410) when etcd
        compacts between pages: the list then starts again, and after `max_restarts` expiries it
        is done in one request without pagination (client-go's pager falls back the same way).
        `transform` is applied to each item as its page arrives (an informer's trim), so the
        whole list is never held as the API sent it."""
        restarts = 0
        while True:
            limit = page_size if restarts < max_restarts else None
            items: list[KubeObject] = []
            cont: str | None = None
            pages = 0
            try:
                while True:
                    page = await self.list(
                        namespace,
                        label_selector=label_selector,
                        field_selector=field_selector,
                        limit=limit,
                        continue_=cont,
                    )
                    pages += 1
                    page_items = page.get("items") or []
                    items.extend(map(transform, page_items) if transform else page_items)
                    md = page.get("metadata") or {}
                    del page, page_items  # the untrimmed page goes before the next one comes
                    cont = md.get("continue") or None
                    if not cont:
                        return ListResult(
                            items, str(md.get("resourceVersion", "")), pages, restarts
                        )
            except Gone:
                if cont is None:  # not an expired continue token: the caller must handle it
                    raise
                restarts += 1

    async def create(
        self,
        obj: KubeObject,
        namespace: str | None = None,
        *,
        field_manager: str | None = None,
        subresource: str | None = None,
    ) -> KubeObject:
        params: Params = [("fieldManager", field_manager)] if field_manager else []
        ns = self._ns(namespace, obj)
        name = name_of(obj) if subresource else None
        return await self.client.request(
            "POST", self.resource.path(ns, name, subresource), params=params, json_body=obj
        )

    async def replace(
        self,
        obj: KubeObject,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> KubeObject:
        """PUT; carries the object's resourceVersion, so a stale write fails with Conflict."""
        params: Params = [("fieldManager", field_manager)] if field_manager else []
        path = self.resource.path(self._ns(namespace, obj), name_of(obj), subresource)
        return await self.client.request("PUT", path, params=params, json_body=obj)

    async def patch(
        self,
        name: str,
        patch: KubeObject | Sequence[KubeObject],
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> KubeObject:
        params: Params = []
        if field_manager:
            params.append(("fieldManager", field_manager))
        if force is not None:
            params.append(("force", "true" if force else "false"))
        path = self.resource.path(self._ns(namespace), name, subresource)
        return await self.client.request(
            "PATCH",
            path,
            params=params,
            data=json.dumps(patch, separators=(",", ":")).encode(),
            content_type=PATCH_CONTENT_TYPES[patch_type],
        )

    async def delete(
        self,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
        preconditions: dict[str, str] | None = None,
    ) -> KubeObject:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            body["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if preconditions:
            body["preconditions"] = preconditions
        path = self.resource.path(self._ns(namespace), name)
        return await self.client.request("DELETE", path, json_body=body)

    async def apply(
        self,
        obj: KubeObject,
        *,
        field_manager: str,
        force: bool = False,
        subresource: str | None = None,
    ) -> KubeObject:
        """Server-side apply; see `reconciler.apply` for when to force."""
        return await self.patch(
            name_of(obj),
            obj,
            self._ns(None, obj),
            patch_type="apply",
            subresource=subresource,
            field_manager=field_manager,
            force=force,
        )

    async def watch(
        self,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
    ) -> AsyncIterator[WatchEvent]:
        """Stream watch events until the server ends the watch. An ERROR event raises its typed
        error (Gone for 410). Close it with `contextlib.aclosing` when stopping early."""
        params = [("watch", "1"), *_selectors(label_selector, field_selector)]
        if resource_version:
            params.append(("resourceVersion", resource_version))
        if allow_bookmarks:
            params.append(("allowWatchBookmarks", "true"))
        if timeout_seconds:
            params.append(("timeoutSeconds", str(timeout_seconds)))
        ns = namespace if self.resource.namespaced else None
        # The server sends a bookmark about every minute, so a long read timeout is safe.
        read_timeout = (timeout_seconds or 1800) + 60.0
        async for line in self.client.stream_lines(
            self.resource.path(ns), params=params, read_timeout=read_timeout
        ):
            event = json.loads(line)
            etype = event.get("type", "")
            obj = event.get("object") or {}
            if etype == "ERROR":
                raise api_error(int(obj.get("code") or 500), obj)
            yield WatchEvent(etype, obj)
