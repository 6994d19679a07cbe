"""Server-side apply for objects and their /status subresource.

An applied configuration names only the fields this field manager wants to own; the API server
merges it with what other managers own, and a field another manager owns is a conflict (409)
unless the apply is forced, which takes the field over.

The rule for `force`:

- Force only fields this manager owns *by design*: the status its controller writes (e.g. our
  TrainingProgress status, which nothing else is meant to write). Then a stray `kubectl` edit must
  not wedge the controller, and taking the field back is right.
- Never force the spec of a user's object, or status fields another controller may own (e.g. a
  TrainJob's status.trainerStatus): apply without force, and treat `Conflict` (raised typed, with
  `field_conflicts` naming each field and its manager) as "someone else owns this; leave it".
- Apply only the fields you mean to own, every time: a field left out of the next apply is
  released (and removed if no one else owns it).
"""

from __future__ import annotations

from .objects import KubeObject, name_of
from .resources import ResourceClient


def _check(obj: KubeObject) -> None:
    missing = [k for k in ("apiVersion", "kind") if not obj.get(k)]
    if not name_of(obj):
        missing.append("metadata.name")
    if missing:
        raise ValueError(f"an applied configuration needs {', '.join(missing)}")


async def apply(
    api: ResourceClient, obj: KubeObject, *, field_manager: str, force: bool = False
) -> KubeObject:
    """Apply `obj` (apiVersion, kind, metadata.name[, namespace] and the fields to own)."""
    _check(obj)
    return await api.apply(obj, field_manager=field_manager, force=force)


async def apply_status(
    api: ResourceClient, obj: KubeObject, *, field_manager: str, force: bool = False
) -> KubeObject:
    """Apply `obj["status"]` through the /status subresource (spec and metadata changes in it are
    ignored by the server). Pass `force=True` only for status this manager owns by design."""
    _check(obj)
    if "status" not in obj:
        raise ValueError("apply_status needs a status")
    return await api.apply(obj, field_manager=field_manager, force=force, subresource="status")


def status_patch(
    api_version: str, kind: str, name: str, namespace: str | None, status: dict
) -> KubeObject:
    """The smallest applied configuration for a status: identity plus the status fields."""
    md: dict[str, str] = {"name": name}
    if namespace:
        md["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": md, "status": status}
