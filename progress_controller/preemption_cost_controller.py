"""Keeps Kueue's priority-boost annotation on each kubeckpt job's Workload current: the thin I/O
shell around preemption_cost (the value) and workload_boost (whether to write it).

Off unless `kubeckpt-reconciler --preemption-cost` (config/components/kueue-preemption-cost),
because it changes what Kueue preempts, and it needs Kueue's Workload API and the right to patch
Workloads. It reads the progress controller's Workload informer (workloads.py), which starts when
discovery finds that API, so the progress controller runs unchanged without Kueue. One reconcile
per Workload, from the caches: the Workload's controlling job, that job's TrainingProgress (the
progress controller's cache, or its newer own write) and the job's creation time. The only API
call is a server-side apply of the one annotation, field manager `kubeckpt-preemption-cost`,
never forced over another writer (only over Kueue's echo of it in a status write,
workload_boost.py): a 409 means another manager took the annotation after the cache saw it, and
it is left to them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubeckpt_api.status_identity import owner_uid
from reconciler.apply import apply
from reconciler.controller import Request, Result
from reconciler.errors import Conflict, NotFound
from reconciler.informer import Informer
from reconciler.manager import Manager
from reconciler.objects import KubeObject, name_of, namespace_of
from trainer_runtime.contract.progress import parse_rfc3339

from . import discovery as d
from .controller import JOB_REF_INDEX, ProgressController
from .preemption_cost import RUNNING_STATES, CostSettings, priority_boost, progress_from_status
from .workload_boost import FIELD_MANAGER, WriteRule, applied_configuration, decide, workload_job
from .workloads import JOB_UID_INDEX, WORKLOADS, workload_job_uid_index

__all__ = ["JOB_UID_INDEX", "WORKLOADS", "PreemptionCostController", "workload_job_uid_index"]

log = logging.getLogger("kubeckpt.preemption_cost")

# How often a running job's Workload is looked at without an event: its cost grows with time.
RECHECK_SECONDS = 30.0


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
    ) -> None:
        self.progress = progress
        self.settings = settings or CostSettings()
        self.rule = rule or WriteRule()
        self.wall = wall  # wall-clock time, as the status's times are
        # Set once the progress controller's Workload informer is made (Kueue found).
        self.api: Any = None
        self.workloads: Informer | None = None
        self.controller = manager.controller("preemption-cost", self.reconcile, workers=4)
        self.controller.watch(
            progress.tps, self._progress_to_workloads, update_predicate=_status_changed
        )
        progress.workloads.on_informer(self._found)
        self.stats = {"writes": 0, "foreign": 0, "conflicts": 0, "unseen": 0}
        # Per Workload: the value last written and the resourceVersion it was written over.
        # Until the cache shows a newer version, a reconcile (a TrainingProgress update) still
        # sees the old value and would write the same one again; on a loaded API server the
        # watch can lag a write by seconds.
        self._written: dict[str, tuple[str, str | None]] = {}

    def _found(self, informer: Informer, api: Any) -> None:
        self.api, self.workloads = api, informer
        self.controller.watch(informer)
        log.info("Kueue's Workload API found: keeping priority boosts current")

    def _progress_to_workloads(self, tp: KubeObject) -> list[Request]:
        uid = owner_uid(tp)
        if uid is None or self.workloads is None:
            return []
        return [Request.from_object(w) for w in self.workloads.store.by_index(JOB_UID_INDEX, uid)]

    async def reconcile(self, req: Request) -> Result | None:
        workload = self.workloads.store.get(req.key) if self.workloads else None
        if workload is None:
            self._written.pop(req.key, None)
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
        version = (workload.get("metadata") or {}).get("resourceVersion")
        if self._written.get(req.key) == (decision.value, version):
            self.stats["unseen"] += 1  # written already; the watch has not brought it back yet
            return recheck
        try:
            await apply(
                self.api,
                applied_configuration(workload, decision.value),
                field_manager=FIELD_MANAGER,
                force=decision.force,  # only over Kueue's status echo (workload_boost)
            )
        except NotFound:
            self._written.pop(req.key, None)
            return None
        except Conflict as e:
            # Another manager took the annotation after our cache saw it: theirs.
            self.stats["conflicts"] += 1
            log.info("%s: priority boost not written: %s", req.key, e.field_conflicts or e)
            return None
        self.stats["writes"] += 1
        self._written[req.key] = (decision.value, version)
        log.debug(
            "%s/%s: priority boost %s", namespace_of(workload), name_of(workload), decision.value
        )
        return recheck
