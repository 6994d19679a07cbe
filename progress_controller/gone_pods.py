"""Rank-0 pods deleted from the API whose final record may still be unread: their last state.

The kubelet writes a terminated container's status (with its termination message, the final
record: a just-in-time checkpoint's among others) and deletes the pod in the same sync, so the
watch's DELETED follows that MODIFIED at once, and a reconcile queued by the MODIFIED finds the
pod gone from the cache. The DELETED event carries the pod's last state: kept here for a while,
the reconcile reads its termination message as it would a pod still being deleted
(`discovery.read_order`, which never reads it after a newer pod's record).

Only what can be read without the pod: a rank-0 pod whose target container terminated with a
termination message. In memory (a restarted controller has none), bounded by `ttl` per pod and
dropped with the job.
"""

from __future__ import annotations

from datetime import UTC, datetime

from reconciler.clock import REAL_CLOCK, Clock
from reconciler.objects import KubeObject
from trainer_runtime.contract.progress import format_rfc3339

from . import discovery as d

GONE_TTL = 600.0  # seconds a gone pod's last state is kept


def final_state(pod: KubeObject) -> tuple[str, KubeObject] | None:
    """(job key, pod) when a deleted pod is worth keeping: a job's rank-0 pod whose container
    terminated with a termination message, marked as deleted (a pod removed at once, grace 0,
    may carry no deletionTimestamp) so that it is never taken for a live one. None otherwise."""
    job, key = d.job_of_pod(pod), d.pod_job_key(pod)
    if job is None or key is None or not d.is_rank0(pod, job[0]):
        return None
    container = d.target_container(pod, job[0])
    if container is None:
        return None
    cs = d.container_state(pod, str(container.get("name", "")))
    if cs.state != "terminated" or not cs.message.strip():
        return None
    md = pod.get("metadata") or {}
    if "deletionTimestamp" not in md:
        md = {**md, "deletionTimestamp": format_rfc3339(datetime.now(UTC))}
        pod = {**pod, "metadata": md}
    return key, pod


class GonePods:
    """Gone pods' last states by job key and pod UID (`remember` is a pod informer's delete
    handler)."""

    def __init__(self, clock: Clock = REAL_CLOCK, ttl: float = GONE_TTL) -> None:
        self.clock = clock
        self.ttl = ttl
        self._pods: dict[str, dict[str, tuple[float, KubeObject]]] = {}

    def remember(self, pod: KubeObject) -> None:
        kept = final_state(pod)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if kept is not None and uid:
            self._pods.setdefault(kept[0], {})[uid] = (self.clock.now(), kept[1])

    def of(self, key: str, live: set[str]) -> list[KubeObject]:
        """The job's gone pods, less those past the ttl (dropped) and any whose UID is among
        `live` (the pods in the cache: not gone after all)."""
        pods = self._pods.get(key)
        if not pods:
            return []
        now = self.clock.now()
        for uid in [u for u, (when, _) in pods.items() if now - when > self.ttl]:
            del pods[uid]
        if not pods:
            del self._pods[key]
        return [pod for uid, (_, pod) in pods.items() if uid not in live]

    def forget(self, key: str) -> None:
        self._pods.pop(key, None)

    def __len__(self) -> int:
        return sum(len(p) for p in self._pods.values())
