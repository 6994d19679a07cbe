"""What the progress controller's caches keep of each object (informer transforms).

Pods are most of the memory (thousands of them, each with its env, annotations and
managedFields), and the controller reads few of their fields: the metadata (labels, owners,
deletion, uid, resourceVersion, creation time) without managedFields, only kubeckpt's annotations
(`kubeckpt.io/...`: the webhook's status, the last-checkpoint annotations; not the push CA, a
certificate per push pod that only the pod reads), each container's name
and the env variables of the contract (trainer_runtime/contract/env.py: the progress path and
update frequency among them) and Trainer's status-server URL (`trainjob.py`), the phase and the
container statuses (name, state, restart count). Every other object keeps all
but its bookkeeping (managedFields, kubectl's last-applied copy): they are few, or their spec is
read (a job's suspend field, a policy's selector).

tests/unit/progress/test_cache_trim.py runs the controller's reconcile on trimmed and untrimmed
caches and requires the same reads, writes, Events and patches.
"""

from __future__ import annotations

from typing import Any

from kubeckpt_api.optin import ANNOTATION_PREFIX, PUSH_CA_ANNOTATION
from reconciler.objects import KubeObject
from reconciler.transform import strip_bookkeeping
from trainer_runtime.contract.env import ALL_ENV_VARS, KUBECKPT_PROGRESS_PUSH_URL

from .trainjob import TRAINER_SERVER_ENV

__all__ = ["POD_PAGE_SIZE", "strip_bookkeeping", "trim_pod"]

# Our push URL too: Trainer's URL equal to it is ours, not Trainer's server (trainjob.py).
_ENV_READ = frozenset({*ALL_ENV_VARS, TRAINER_SERVER_ENV, KUBECKPT_PROGRESS_PUSH_URL})

# Pods are listed in pages of this many: a page is held whole (as sent, then decoded) while it is
# trimmed, and what it took stays in the process's RSS (the allocator keeps it for reuse), so a
# page of 500 pods of 40 KiB costs about 100 MiB at sync; 100 costs a fifth of that, for a few
# more LIST requests (docs/benchmarks.md).
POD_PAGE_SIZE = 100
_POD_STATUS = ("phase", "reason")
# Of each container status, what discovery.container_state reads (images and their digests,
# often longer than the rest, are not).
_CONTAINER_STATUS = ("name", "state", "restartCount")


def _container(c: Any) -> dict[str, Any]:
    if not isinstance(c, dict):
        return {}
    out: dict[str, Any] = {"name": c.get("name")}
    env = c.get("env")
    if isinstance(env, list):
        out["env"] = [e for e in env if isinstance(e, dict) and e.get("name") in _ENV_READ]
    return out


def trim_pod(pod: KubeObject) -> KubeObject:
    """The pod as far as the controller reads it (see the module docstring)."""
    md = dict(pod.get("metadata") or {})
    md.pop("managedFields", None)
    annotations = md.get("annotations")
    if isinstance(annotations, dict):
        ours = {
            k: v
            for k, v in annotations.items()
            if k.startswith(ANNOTATION_PREFIX) and k != PUSH_CA_ANNOTATION
        }
        if ours:
            md["annotations"] = ours
        else:
            del md["annotations"]
    out: KubeObject = {"apiVersion": pod.get("apiVersion"), "kind": pod.get("kind"), "metadata": md}
    spec = pod.get("spec")
    if isinstance(spec, dict):
        out["spec"] = {"containers": [_container(c) for c in spec.get("containers") or []]}
    status = pod.get("status")
    if isinstance(status, dict):
        out["status"] = {k: status[k] for k in _POD_STATUS if k in status}
        statuses = status.get("containerStatuses")
        if isinstance(statuses, list):
            out["status"]["containerStatuses"] = [
                {k: cs[k] for k in _CONTAINER_STATUS if k in cs}
                for cs in statuses
                if isinstance(cs, dict)
            ]
    return out
