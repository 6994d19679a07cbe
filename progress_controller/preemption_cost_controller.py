"""Keeps Kueue's priority-boost annotation on each kubeckpt job's Workload current: the thin I/O
shell around preemption_cost (the value) and workload_boost (whether to write it).

Off unless `kubeckpt-reconciler --preemption-cost` (config/components/kueue-preemption-cost),
because it changes what Kueue preempts, and it needs Kueue's Workload API and the rights on it.
The Workload informer starts when discovery finds that API (looked for every 30 s), so the
progress controller runs unchanged without Kueue. One reconcile per Workload, from the caches:
the Workload's controlling job, that job's TrainingProgress (the progress controller's cache, or
its newer own write) and the job's creation time. The only API call is a server-side apply of
the one annotation, field manager `kubeckpt-preemption-cost`, never forced: a 409 means another
manager took the annotation after the cache saw it, and it is left to them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubeckpt_api.status_identity import owner_uid
from reconciler.apply import apply
from reconciler.controller import Request, Result
from reconciler.errors import ApiError, Conflict, NotFound, ResourceNotFound
from reconciler.informer import Informer
from reconciler.manager import Manager
from reconciler.objects import KubeObject, name_of, namespace_of
from reconciler.resources import Resource
from trainer_runtime.contract.progress import parse_rfc3339

from . import discovery as d
from .controller import JOB_REF_INDEX, ProgressController
from .preemption_cost import RUNNING_STATES, CostSettings, priority_boost, progress_from_status
from .workload_boost import (
    FIELD_MANAGER,
    WORKLOAD_API_VERSION,
    WORKLOAD_GROUP,
    WORKLOAD_PLURAL,
    WORKLOAD_VERSION,
    WriteRule,
    applied_configuration,
    decide,
    trim_workload,
    workload_job,
)

log = logging.getLogger("kubeckpt.preemption_cost")

WORKLOADS = Resource(WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL, "Workload")
# Workloads by the UID of the job that controls them.
JOB_UID_INDEX = "kubeckpt.io/job-uid"
# How often a running job's Workload is looked at without an event: its cost grows with time.
RECHECK_SECONDS = 30.0


def workload_job_uid_index(workload: KubeObject) -> list[str]:
    job = workload_job(workload)
    return [job.uid] if job else []


def _status_changed(old: KubeObject, new: KubeObject) -> bool:
    return old.get("status") != new.get("status")


def _time(text: object) -> datetime | None:
    try:
        return parse_rfc3339(text) if isinstance(text, str) else None
    except ValueError:
        return None


class PreemptionCostController:
    def __init__(
        self,
        manager: Manager,
        progress: ProgressController,
        *,
        settings: CostSettings | None = None,
        rule: WriteRule | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        discovery_interval: float = 30.0,
    ) -> None:
        self.progress = progress
        self.settings = settings or CostSettings()
        self.rule = rule or WriteRule()
        self.wall = wall  # wall-clock time, as the status's times are
        self.client = manager.client
        self.interval = discovery_interval
        # Made once the Workload API is there (Kueue may be installed later, or not at all): an
        # informer the manager waited on would keep the whole reconciler unready without Kueue.
        self.api: Any = None
        self.workloads: Informer | None = None
        self._task: asyncio.Task[None] | None = None
        self.controller = manager.controller("preemption-cost", self.reconcile, workers=4)
        self.controller.watch(
            progress.tps, self._progress_to_workloads, update_predicate=_status_changed
        )
        manager.add_runnable(self.run, leader_only=False)
        self.stats = {"writes": 0, "foreign": 0, "conflicts": 0}

    async def _discover(self) -> bool:
        """Start the Workload informer when the API is served; whether it runs."""
        if self.workloads is not None:
            return True
        try:
            await self.client.resource(WORKLOAD_API_VERSION, WORKLOAD_PLURAL)
        except (ResourceNotFound, ApiError):
            return False
        self.api = self.client.api(WORKLOADS)
        self.workloads = Informer(
            self.api,
            name="workloads",
            indexers={JOB_UID_INDEX: workload_job_uid_index},
            transform=trim_workload,
        )
        self.controller.watch(self.workloads)
        self._task = asyncio.create_task(self.workloads.run(), name="informer:workloads")
        log.info("Kueue's Workload API found: keeping priority boosts current")
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

    def _progress_to_workloads(self, tp: KubeObject) -> list[Request]:
        uid = owner_uid(tp)
        if uid is None or self.workloads is None:
            return []
        return [Request.from_object(w) for w in self.workloads.store.by_index(JOB_UID_INDEX, uid)]

    async def reconcile(self, req: Request) -> Result | None:
        workload = self.workloads.store.get(req.key) if self.workloads else None
        if workload is None:
            return None
        owner = workload_job(workload)
        if owner is None:
            return None  # not a training job's
        key = d.job_key(owner.kind, req.namespace, owner.name)
        job, _ = self.progress.job(key)
        if job is None or (job.get("metadata") or {}).get("uid") != owner.uid:
            return None
        tps = [
            tp
            for tp in self.progress.tps.store.by_index(JOB_REF_INDEX, key)
            if owner_uid(tp) == owner.uid
        ]
        if not tps:
            return None  # not a kubeckpt job (or its TrainingProgress is not made yet)
        status = self.progress.stored(key, tps[0]).get("status") or {}
        now = self.wall()
        started = _time((job.get("metadata") or {}).get("creationTimestamp"))
        progress = progress_from_status(status, now=now, started=started)
        boost = priority_boost(progress, self.settings) if progress else None
        decision = decide(workload, boost, now=now, rule=self.rule)
        recheck = (
            Result(requeue_after=RECHECK_SECONDS) if status.get("state") in RUNNING_STATES else None
        )
        if decision.action == "foreign":
            self.stats["foreign"] += 1
            log.debug("%s: priority boost owned by %s, left alone", req.key, decision.owners)
            return None
        if decision.action == "not-yet" and decision.after is not None:
            return Result(requeue_after=min(decision.after, RECHECK_SECONDS))
        if not decision.write or decision.value is None:
            return recheck
        try:
            await apply(
                self.api,
                applied_configuration(workload, decision.value),
                field_manager=FIELD_MANAGER,
                force=False,
            )
        except NotFound:
            return None
        except Conflict as e:
            # Another manager took the annotation after our cache saw it: theirs.
            self.stats["conflicts"] += 1
            log.info("%s: priority boost not written: %s", req.key, e.field_conflicts or e)
            return None
        self.stats["writes"] += 1
        log.debug(
            "%s/%s: priority boost %s", namespace_of(workload), name_of(workload), decision.value
        )
        return recheck
