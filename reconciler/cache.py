"""The informer's local cache: objects by key, with secondary indexes (client-go's Indexer).

Objects are the dicts the API returned and are shared with every reader: treat them as read-only
(copy before changing one), as with client-go's cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .objects import KubeObject, namespace_of, object_key

IndexFunc = Callable[[KubeObject], list[str]]
NAMESPACE_INDEX = "namespace"


def namespace_index(obj: KubeObject) -> list[str]:
    return [namespace_of(obj)]


def label_index(label: str) -> IndexFunc:
    """Index objects by the value of one label (objects without it are not indexed)."""

    def index(obj: KubeObject) -> list[str]:
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
        return [value] if value is not None else []

    return index


def owner_index(obj: KubeObject) -> list[str]:
    """Index by owner reference, as "Kind/name" (owners share the object's namespace)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [f"{o.get('kind')}/{o.get('name')}" for o in refs]


class Store:
    def __init__(self, indexers: dict[str, IndexFunc] | None = None) -> None:
        self._items: dict[str, KubeObject] = {}
        self._indexers: dict[str, IndexFunc] = {NAMESPACE_INDEX: namespace_index}
        self._indices: dict[str, dict[str, set[str]]] = {NAMESPACE_INDEX: {}}
        if indexers:
            self.add_indexers(indexers)

    # --- reads ---
    def get(self, key: str) -> KubeObject | None:
        return self._items.get(key)

    def get_by_name(self, name: str, namespace: str = "") -> KubeObject | None:
        return self._items.get(f"{namespace}/{name}" if namespace else name)

    def list(self, namespace: str | None = None) -> list[KubeObject]:
        if namespace is None:
            return list(self._items.values())
        return self.by_index(NAMESPACE_INDEX, namespace)

    def keys(self) -> list[str]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[KubeObject]:
        return iter(list(self._items.values()))

    def index_keys(self, index: str, value: str) -> set[str]:
        try:
            return set(self._indices[index].get(value, ()))
        except KeyError:
            raise KeyError(f"no index named {index!r}") from None

    def by_index(self, index: str, value: str) -> list[KubeObject]:
        return [self._items[k] for k in sorted(self.index_keys(index, value))]

    def index_values(self, index: str) -> list[str]:
        return [v for v, keys in self._indices[index].items() if keys]

    # --- writes (the informer's) ---
    def add_indexers(self, indexers: dict[str, IndexFunc]) -> None:
        for name, fn in indexers.items():
            if name in self._indexers:
                raise ValueError(f"index {name!r} exists")
            self._indexers[name] = fn
            self._indices[name] = {}
            for key, obj in self._items.items():
                self._index(name, fn, key, obj)

    def _index(self, name: str, fn: IndexFunc, key: str, obj: KubeObject) -> None:
        index = self._indices[name]
        for value in fn(obj):
            index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: KubeObject) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def put(self, obj: KubeObject) -> tuple[str, KubeObject | None]:
        """Insert or replace; returns (key, previous object or None)."""
        key = object_key(obj)
        old = self._items.get(key)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = obj
        for name, fn in self._indexers.items():
            self._index(name, fn, key, obj)
        return key, old

    def delete(self, key: str) -> KubeObject | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def snapshot(self) -> dict[str, Any]:
        return dict(self._items)
