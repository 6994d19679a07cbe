"""Transforms an informer applies to each object before it enters the cache (client-go's
`SetTransform`): a controller that keeps only the fields it reads holds a fraction of the memory.

A transform gets the object as the API sent it (freshly decoded, owned by the informer: it may be
changed in place) and returns what to cache. It must keep `metadata.name`, `namespace`,
`resourceVersion` and `uid` (the cache's key and the informer's resume point), and everything
the informer's indexers, event handlers and the controller's reads look at. It is applied to
LIST pages as they arrive, so a big first LIST is never held whole.
"""

from __future__ import annotations

from collections.abc import Callable

from .objects import KubeObject

Transform = Callable[[KubeObject], KubeObject]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def strip_managed_fields(obj: KubeObject) -> KubeObject:
    """Drop `metadata.managedFields` (server-side apply's bookkeeping: often larger than the
    object's spec, and read by no controller that does not manage fields itself)."""
    md = obj.get("metadata")
    if isinstance(md, dict):
        md.pop("managedFields", None)
    return obj


def strip_last_applied(obj: KubeObject) -> KubeObject:
    """Drop kubectl's last-applied-configuration annotation (a second copy of the object as
    last applied by `kubectl apply`)."""
    md = obj.get("metadata")
    annotations = md.get("annotations") if isinstance(md, dict) else None
    if isinstance(annotations, dict) and LAST_APPLIED in annotations:
        del annotations[LAST_APPLIED]
        if not annotations:
            del md["annotations"]  # type: ignore[index]
    return obj


def strip_bookkeeping(obj: KubeObject) -> KubeObject:
    """Both of the above: what no controller reading specs and statuses needs."""
    return strip_last_applied(strip_managed_fields(obj))


def chain(*transforms: Transform) -> Transform:
    """One transform that applies each of `transforms` in turn."""

    def apply(obj: KubeObject) -> KubeObject:
        for t in transforms:
            obj = t(obj)
        return obj

    return apply
