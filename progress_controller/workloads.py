"""Kueue's Workloads, read-only and shared: one informer for the progress controller (why a job is
suspended: kueue_eviction.py) and the priority-boost writer (preemption_cost_controller.py).

Kueue may be installed later or not at all: the informer starts once discovery finds the Workload
API (looked for every `interval` seconds), so without Kueue nothing changes and nothing waits on
it (an informer the manager waited on would keep the reconciler unready). Each consumer is told
once, when the informer is made. The cache keeps what the two read (`trim_workload`): metadata
with only the boost annotation and its managedFields, and the eviction conditions, not the job's
pod templates (most of a Workload's size).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.errors import ApiError, ResourceNotFound
from reconciler.informer import Informer
from reconciler.objects import KubeObject
from reconciler.resources import Resource

from . import kueue_eviction, workload_boost
from .workload_boost import WORKLOAD_API_VERSION, WORKLOAD_GROUP, WORKLOAD_PLURAL, WORKLOAD_VERSION

log = logging.getLogger("kubeckpt.workloads")

WORKLOADS = Resource(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL, "Workload")
# Workloads by the UID of the job that controls them.
JOB_UID_INDEX = "kubeckpt.io/job-uid"
# Workloads by their own UID (Kueue names a preemptor by it).
UID_INDEX = "kubeckpt.io/uid"


def workload_job_uid_index(workload: KubeObject) -> list[str]:
    job = workload_boost.workload_job(workload)
    return [job.uid] if job else []


def workload_uid_index(workload: KubeObject) -> list[str]:
    uid = (workload.get("metadata") or {}).get("uid")
    return [uid] if isinstance(uid, str) and uid else []


def trim_workload(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The Workload as the cache keeps it (an informer transform): workload_boost's metadata and
    kueue_eviction's conditions."""
    out = workload_boost.trim_workload(workload)
    conditions = kueue_eviction.trim_conditions(workload)
    if conditions:
        out["status"] = {"conditions": conditions}
    return out


OnInformer = Callable[[Informer, Any], None]


class WorkloadWatcher:
    """Starts the shared Workload informer when discovery finds Kueue's API, then tells each
    consumer (`on_informer(informer, api)`) once."""

    def __init__(self, client: Any, *, interval: float = 30.0) -> None:
        self.client = client
        self.interval = interval
        self.api: Any = None
        self.informer: Informer | None = None
        self._consumers: list[OnInformer] = []
        self._task: asyncio.Task[None] | None = None

    def on_informer(self, consumer: OnInformer) -> None:
        """Call `consumer` with the informer once it is made (at once if it already is)."""
        self._consumers.append(consumer)
        if self.informer is not None:
            consumer(self.informer, self.api)

    def by_uid(self, uid: str) -> KubeObject | None:
        """The cached Workload with this UID, or None (not cached, or no Kueue)."""
        if self.informer is None:
            return None
        found = self.informer.store.by_index(UID_INDEX, uid)
        return found[0] if found else None

    def of_job(self, job_uid: str) -> list[KubeObject]:
        """The cached Workloads the job with this UID controls."""
        if self.informer is None or not job_uid:
            return []
        return self.informer.store.by_index(JOB_UID_INDEX, job_uid)

    async def _discover(self) -> bool:
        """Start the informer when the API is served; whether it runs."""
        if self.informer is not None:
            return True
        try:
            await self.client.resource(WORKLOAD_API_VERSION, WORKLOAD_PLURAL)
        except (ResourceNotFound, ApiError):
            return False
        self.api = self.client.api(WORKLOADS)
        self.informer = Informer(
            self.api,
            name="workloads",
            indexers={JOB_UID_INDEX: workload_job_uid_index, UID_INDEX: workload_uid_index},
            transform=trim_workload,
        )
        for consumer in self._consumers:
            consumer(self.informer, self.api)
        self._task = asyncio.create_task(self.informer.run(), name="informer:workloads")
        log.info("Kueue's Workload API found: watching Workloads")
        return True

    async def run(self) -> None:
        """Look for the Workload API every `interval` seconds until it is there."""
        try:
            while True:
                if await self._discover():
                    await asyncio.Event().wait()  # the informer runs in its own task
                await asyncio.sleep(self.interval)
        finally:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
