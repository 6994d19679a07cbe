"""The progress controller: PyTorchJobs with injected pods -> TrainingProgress status.

One reconcile per job (key namespace/name, the job's and the TrainingProgress's): make sure the
TrainingProgress exists (owned by the job), find the rank-0 pod, read its progress (exec while the
container runs, the termination message once it has terminated), decide the new status from the
stored one (`decide`), apply it to /status only when something changed, then send the
events the change means, and put the latest complete checkpoint on every pod of the job
(`lastcheckpoint`: annotations for checkpoint-aware preemption). Decisions are read from the
informers' caches; the only API calls are the exec, the TrainingProgress create, the status apply,
the pods' annotation patches when their values differ (and Events).

A job is read at most once per interval (`schedule`): pod and job events that arrive sooner are
answered from the cache, except a new rank-0 pod or a terminated container, which are read at
once. Bad input of one job ends in a condition on that job only.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubeckpt_api import status_bounds as bounds
from kubeckpt_api.groupversion import CHECKPOINT_POLICY, TRAINING_PROGRESS
from kubeckpt_api.optin import opted_in, select_policy
from reconciler.apply import apply_status, status_patch
from reconciler.clock import REAL_CLOCK, Clock
from reconciler.controller import Request, Result, generation_changed
from reconciler.errors import AlreadyExists, ApiError, Conflict, KubeError, NotFound
from reconciler.exec import exec_command
from reconciler.manager import Manager
from reconciler.objects import KubeObject, name_of, namespace_of, object_key
from reconciler.resources import NAMESPACES, PODS, Resource

from . import discovery as d
from .decide import FIELD_MANAGER, Decision, Observation, changed, decide
from .lastcheckpoint import pod_patch, wanted
from .metrics import ProgressCollector
from .reading import ExecFn, ReadError, parse, read_file
from .schedule import ExecLimiter, PollSettings, poll_interval, stall_after, update_period
from .trainjob import TRAINJOB_API_VERSION, TrainJobWatcher, trainer_status, trainer_status_server

log = logging.getLogger("kubeckpt.progress")

PYTORCHJOBS = Resource(
    d.PYTORCHJOB.group, d.PYTORCHJOB.version, d.PYTORCHJOB.plural, d.PYTORCHJOB.kind
)
TRAININGPROGRESSES = TRAINING_PROGRESS.resource
CHECKPOINTPOLICIES = CHECKPOINT_POLICY.resource
JOB_INDEX = "kubeckpt.io/job"
# The pods' last-checkpoint annotations are written under a manager of their own, so that
# managedFields tell them from the TrainingProgress status ("kubeckpt").
ANNOTATION_FIELD_MANAGER = "kubeckpt-last-checkpoint"


def pod_job_index(pod: KubeObject) -> list[str]:
    """Index training pods by "namespace/job" (the TrainingProgress's key, whatever the kind)."""
    job = d.job_of_pod(pod)
    if job is None:
        return []
    return [f"{namespace_of(pod)}/{job[1]}"]


def pod_to_job(pod: KubeObject) -> list[Request]:
    return [Request.from_key(k) for k in pod_job_index(pod)]


def _pod_changed(old: KubeObject, new: KubeObject) -> bool:
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    return old.get("status") != new.get("status") or (
        om.get("deletionTimestamp") != nm.get("deletionTimestamp")
    )


def _job_changed(old: KubeObject, new: KubeObject) -> bool:
    return old.get("status") != new.get("status") or old.get("spec") != new.get("spec")


def _rv(obj: KubeObject | None) -> int:
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", 0))
    except (TypeError, ValueError):
        return 0


@dataclass
class _JobState:
    first_seen: float
    next_poll: float = 0.0
    last_change: float | None = None
    pod: str | None = None
    pod_uid: str | None = None
    new_pod: bool = False  # the rank-0 pod was replaced and no record from the new one yet
    step: int | None = None
    exec_failures: int = 0  # transport failures in a row (TRANSIENT_READ_ERRORS)


# Exec transport failures (API server or node hiccups), not the file's content: one in a row is
# not written, so that a blip does not flip Progressing to Unknown and back (two writes per job,
# for every job at once when the API server is what hiccuped); the next poll writes it if it
# persists.
TRANSIENT_READ_ERRORS = frozenset({"ExecFailed", "ExecTimeout"})
TRANSIENT_TOLERANCE = 1


class ProgressController:
    def __init__(
        self,
        manager: Manager,
        *,
        settings: PollSettings | None = None,
        limiter: ExecLimiter | None = None,
        exec_fn: ExecFn = exec_command,
        exec_timeout: float = 10.0,
        workers: int = 16,
        clock: Clock = REAL_CLOCK,
        trainjob_interval: float = 30.0,
    ) -> None:
        client = manager.client
        self.client = client
        self.settings = settings or PollSettings()
        self.limiter = limiter or ExecLimiter()
        self.exec_fn = exec_fn
        self.exec_timeout = exec_timeout
        self.clock = clock
        self.tp_api = client.api(TRAININGPROGRESSES)
        self.pod_api = client.api(PODS)
        self.jobs = manager.informer(client.api(PYTORCHJOBS))
        self.pods = manager.informer(
            client.api(PODS),
            label_selector=f"{d.INJECTED_LABEL}=true",
            indexers={JOB_INDEX: pod_job_index},
        )
        self.tps = manager.informer(self.tp_api)
        # Training pods the webhook did not mark, to tell when one should have been injected:
        # one informer per kind's pod label (a label selector cannot OR two labels, and one
        # on `injected!=true` alone would cache every pod in the cluster).
        self.bare_pods = [
            manager.informer(
                client.api(PODS),
                label_selector=f"{label},{d.INJECTED_LABEL}!=true",
                indexers={JOB_INDEX: pod_job_index},
            )
            for label in sorted({k.name_label for k in d.JOB_KINDS})
        ]
        self.namespaces = manager.informer(client.api(NAMESPACES))
        self.policies = manager.informer(client.api(CHECKPOINTPOLICIES))
        self.events = manager.event_recorder("kubeckpt-reconciler")
        self.controller = manager.controller("progress", self.reconcile, workers=workers)
        self.controller.watch(self.jobs, update_predicate=_job_changed)
        self.controller.watch(self.pods, pod_to_job, update_predicate=_pod_changed)
        # Our own status writes come back as updates: they must not trigger a read.
        self.controller.watch(self.tps, update_predicate=generation_changed)
        for inf in self.bare_pods:
            self.controller.watch(inf, pod_to_job, update_predicate=lambda o, n: False)
        self._state: dict[str, _JobState] = {}
        # Our last write per job, newer than the cache until the watch delivers it.
        self._written: dict[str, KubeObject] = {}
        # The same for pods' annotations: job key -> pod uid -> (resourceVersion, annotations).
        self._annotated: dict[str, dict[str, tuple[int, dict[str, str]]]] = {}
        self.trainjobs = TrainJobWatcher(
            client,
            lambda inf: self.controller.watch(inf, update_predicate=_job_changed),
            interval=trainjob_interval,
        )
        manager.add_runnable(self.trainjobs.run, leader_only=False)
        self._trainer_conflicts: set[str] = set()
        self.stats = {"reads": 0, "writes": 0, "skipped_writes": 0, "annotation_writes": 0}
        self.manager = manager
        manager.metrics.registry.register(
            ProgressCollector(self.job_statuses, self.stats, lambda: manager.is_leader)
        )

    # --- helpers ---
    def _forget(self, key: str) -> None:
        self._state.pop(key, None)
        self._written.pop(key, None)
        self._annotated.pop(key, None)
        self._trainer_conflicts.discard(key)

    def job(self, key: str) -> tuple[KubeObject | None, d.JobKind]:
        """The job with this key from the caches, and its kind."""
        job = self.jobs.store.get(key)
        if job is not None:
            return job, d.PYTORCHJOB
        inf = self.trainjobs.informer
        if inf is not None and (job := inf.store.get(key)) is not None:
            return job, d.TRAINJOB
        return None, d.PYTORCHJOB

    def job_statuses(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(namespace, name, status) of each job's TrainingProgress, newest known, for the jobs
        that still exist (what /metrics exports)."""
        for tp in list(self.tps.store):
            key = object_key(tp)
            if self.job(key)[0] is None:
                continue
            tp = self.stored(key, tp)
            yield namespace_of(tp), name_of(tp), tp.get("status") or {}

    def stored(self, key: str, tp: KubeObject) -> KubeObject:
        """The newer of the cached TrainingProgress and the one this controller last wrote (the
        cache lags its own writes)."""
        return self._stored(key, tp) if key in self._written else tp

    def _stored(self, key: str, tp: KubeObject) -> KubeObject:
        mine = self._written.get(key)
        if (
            mine is not None
            and mine.get("metadata", {}).get("uid") == tp.get("metadata", {}).get("uid")
            and _rv(mine) > _rv(tp)
        ):
            return mine
        self._written.pop(key, None)
        return tp

    async def _ensure_tp(self, key: str, job: KubeObject, kind: d.JobKind) -> KubeObject | None:
        tp = self.tps.store.get(key)
        if tp is not None:
            return tp
        md = job["metadata"]
        ref = {"apiVersion": job.get("apiVersion") or kind.api_version, "kind": kind.kind}
        body = {
            "apiVersion": TRAINING_PROGRESS.api_version,
            "kind": TRAINING_PROGRESS.kind,
            "metadata": {
                "name": md["name"],
                "namespace": md["namespace"],
                "labels": {"app.kubernetes.io/managed-by": "kubeckpt"},
                "ownerReferences": [
                    {**ref, "name": md["name"], "uid": md["uid"], "controller": True}
                ],
            },
            "spec": {"jobRef": {**ref, "name": md["name"]}},
        }
        try:
            tp = await self.tp_api.create(body)
        except AlreadyExists:
            tp = await self.tp_api.get(md["name"], md["namespace"])
        self._written[key] = tp
        return tp

    def _not_injected(self, key: str) -> list[str]:
        """The job's pods that the webhook should have injected and did not: opted in, a
        matching CheckpointPolicy, no marker (the webhook fails open when it is down)."""
        out = []
        # By name: a pod carrying both kinds' labels is in both caches.
        bare = {name_of(p): p for inf in self.bare_pods for p in inf.store.by_index(JOB_INDEX, key)}
        for pod in bare.values():
            md = pod.get("metadata") or {}
            labels = md.get("labels") or {}
            if md.get("deletionTimestamp") or d.STATUS_ANNOTATION in (md.get("annotations") or {}):
                continue
            ns = md.get("namespace", "")
            if not opted_in(labels, self.namespaces.store.get(ns)):
                continue
            policy, _ = select_policy(self.policies.store.list(ns), labels)
            if policy is not None:
                out.append(md.get("name", ""))
        return sorted(out)

    async def _read(
        self, pod: KubeObject, container: dict[str, Any], kind: d.JobKind
    ) -> Observation:
        obs = Observation(pod=name_of(pod), source="exec")
        path = d.progress_path(container)
        try:
            async with self.limiter.slot():
                self.stats["reads"] += 1
                data, _ = await read_file(
                    self.exec_fn,
                    self.client,
                    namespace_of(pod),
                    name_of(pod),
                    container.get("name"),
                    path,
                    timeout=self.exec_timeout,
                )
            obs.record = parse(data)
        except ReadError as e:
            obs.error_reason, obs.error_message = e.reason, e.message
        return obs

    # --- reconcile ---
    async def reconcile(self, req: Request) -> Result | None:
        key = req.key
        job, kind = self.job(key)
        if job is None:
            self._forget(key)
            return None  # the TrainingProgress goes with the job (ownerReference)
        pods = self.pods.store.by_index(JOB_INDEX, key)
        missed = self._not_injected(key)
        suspended = d.suspended(job, kind)
        if not pods and not missed and not (suspended and self.tps.store.get(key) is not None):
            return None  # not an injected job (yet): pod events bring it back
        tp = await self._ensure_tp(key, job, kind)
        if tp is None:
            return None
        tp = self._stored(key, tp)
        prev_status = copy.deepcopy(tp.get("status") or {})
        now = self.clock.now()
        state = self._state.setdefault(key, _JobState(first_seen=now))
        outcome = d.job_outcome(job)
        pod = d.rank0_pod(pods, kind)
        container = d.target_container(pod, kind) if pod is not None else None
        running = False
        hold = False  # a first transient exec failure: keep the stored status as it is
        frequency = d.DEFAULT_UPDATE_FREQUENCY
        if pod is None or container is None:
            obs = Observation(outcome=outcome)
            if outcome is None and not suspended and not prev_status.get("observedPod"):
                obs.error_reason = "NoRank0Pod"
                obs.error_message = "no injected rank-0 (master) pod found for the job"
        else:
            frequency = d.update_frequency(container)
            cs = d.container_state(pod, container.get("name", ""))
            pod_name = name_of(pod)
            pod_uid = (pod.get("metadata") or {}).get("uid")
            if state.pod_uid is not None and pod_uid != state.pod_uid:
                state.new_pod = True
            if cs.state == "terminated":
                obs = Observation(pod=pod_name, source="terminationMessage", outcome=outcome)
                if cs.message.strip():
                    try:
                        obs.record = parse(cs.message, "termination message")
                    except ReadError as e:
                        obs.error_reason, obs.error_message = e.reason, e.message
            elif cs.state == "running" and outcome is None:
                running = True
                due = now >= state.next_poll or pod_uid != state.pod_uid
                if not due:
                    # No read, but a pod created since (a restarted rank) gets the annotations.
                    await self._publish_checkpoint(key, prev_status)
                    return Result(requeue_after=max(state.next_poll - now, 0.01))
                obs = await self._read(pod, container, kind)
                obs.outcome = outcome
                if obs.error_reason in TRANSIENT_READ_ERRORS:
                    state.exec_failures += 1
                    if state.exec_failures <= TRANSIENT_TOLERANCE and prev_status:
                        log.info("%s: %s (not recorded yet)", key, obs.error_message)
                        hold = True
                else:
                    state.exec_failures = 0
            else:
                obs = Observation(pod=pod_name, outcome=outcome)
            obs.new_pod = state.new_pod
            state.pod, state.pod_uid = pod_name, pod_uid
        # Only a stepSeconds in range sizes polling and the stall window (status_bounds).
        if obs.record is not None and obs.record.step_seconds is not None:
            rec_step_seconds = bounds.step_seconds(obs.record.step_seconds)
        else:
            rec_step_seconds = bounds.step_seconds(prev_status.get("stepSeconds"))
        period = update_period(rec_step_seconds, frequency)
        if running:
            obs.stall_after = stall_after(self.settings, period)
        obs.not_injected = missed
        obs.suspended = suspended
        obs.job_created = d.created(job)
        decision = decide(prev_status, obs, datetime.now(UTC))
        if hold:
            self.stats["skipped_writes"] += 1
        else:
            await self._write(key, job, tp, prev_status, decision)
            if (
                kind.progress_status_field
                and self.trainjobs.has_trainer_status
                and not (container is not None and trainer_status_server(container))
            ):
                await self._write_trainer_status(key, job, decision.status)
        await self._publish_checkpoint(key, prev_status if hold else decision.status)
        if decision.accepted:
            state.new_pod = False
        if decision.accepted and obs.record is not None and obs.record.step != state.step:
            state.step = obs.record.step
            state.last_change = now
        if not running:
            return None
        interval = poll_interval(
            self.settings,
            has_record=state.step is not None,
            age=now - state.first_seen,
            since_change=None if state.last_change is None else now - state.last_change,
            period=period,
        )
        state.next_poll = now + interval
        return Result(requeue_after=interval)

    async def _write(
        self, key: str, job: KubeObject, tp: KubeObject, prev: dict[str, Any], dec: Decision
    ) -> None:
        if not changed(prev, dec.status):
            self.stats["skipped_writes"] += 1
            return
        md = tp["metadata"]
        body = status_patch(
            TRAINING_PROGRESS.api_version,
            TRAINING_PROGRESS.kind,
            md["name"],
            md["namespace"],
            dec.status,
        )
        try:
            written = await apply_status(self.tp_api, body, field_manager=FIELD_MANAGER, force=True)
        except NotFound:
            self._written.pop(key, None)
            return  # the TrainingProgress went (job deleted); its delete event comes back
        except (Conflict, ApiError) as e:
            log.warning("%s: status apply failed: %s", key, e)
            raise
        self.stats["writes"] += 1
        self._written[key] = written
        # Events only once the status that records them is stored: a restarted controller
        # compares with it and does not send them again.
        for ev in dec.events:
            self.events.event(job, ev.type, ev.reason, ev.message)

    async def _publish_checkpoint(self, key: str, status: dict[str, Any]) -> None:
        """Make every pod of the job carry its latest complete checkpoint (`lastcheckpoint`).

        Only a pod whose annotations differ is patched: a poll that changes nothing writes
        nothing, and a pod created since (a restarted rank) is written at the next reconcile.
        Never raises: a pod that went or was replaced, or a refused write, must not stall the
        job's status; the next reconcile decides again from what the pod then carries.
        """
        want = wanted(status)
        if want is None:
            return
        # Every pod of the job, injected or not: a scheduler preempts the job's pods together.
        pods: dict[str, KubeObject] = {
            uid: p
            for inf in (self.pods, *self.bare_pods)
            for p in inf.store.by_index(JOB_INDEX, key)
            if (uid := (p.get("metadata") or {}).get("uid"))
        }
        mine = self._annotated.setdefault(key, {})
        for uid in [u for u in mine if u not in pods]:
            del mine[uid]
        for uid, pod in pods.items():
            md = pod.get("metadata") or {}
            last = mine.get(uid)
            if last is not None and last[0] > _rv(pod):
                pod = {**pod, "metadata": {**md, "annotations": last[1]}}  # cache not caught up
            else:
                mine.pop(uid, None)
            patch = pod_patch(want, pod)
            if patch is None:
                continue
            # A JSON merge patch of metadata.annotations alone, not an update or an apply: it
            # names only our two keys (the pod's other annotations, labels and spec are left
            # alone), null removes one, and it carries no resourceVersion, so it needs no read
            # and does not conflict with the kubelet's writes. An apply would also take
            # ownership, and a key a user set would be a conflict to force. No uid either: a
            # same-named replacement (a PyTorchJob's) is the same job's pod and wants the same
            # values (the API server answers a uid that differs with 422, not 409).
            body = {"metadata": {"annotations": patch}}
            name, ns = md.get("name", ""), md.get("namespace", "")
            try:
                written = await self.pod_api.patch(
                    name, body, ns, patch_type="merge", field_manager=ANNOTATION_FIELD_MANAGER
                )
            except (NotFound, Conflict):
                mine.pop(uid, None)  # gone (its delete event comes), or raced: decided again
                continue
            except KubeError as e:
                log.warning("%s: pod %s: last-checkpoint annotations not written: %s", key, name, e)
                continue
            self.stats["annotation_writes"] += 1
            wmd = written.get("metadata") or {}
            if wmd.get("uid") == uid:
                mine[uid] = (_rv(written), dict(wmd.get("annotations") or {}))
        if not mine:
            self._annotated.pop(key, None)

    async def _write_trainer_status(self, key: str, job: KubeObject, status: dict) -> None:
        """TrainJob status.trainerStatus, not forced: another owner keeps it (Conflict)."""
        if key in self._trainer_conflicts or self.trainjobs.api is None:
            return
        ts = trainer_status(status)
        if ts is None or (job.get("status") or {}).get("trainerStatus") == ts:
            return
        md = job["metadata"]
        body = status_patch(
            TRAINJOB_API_VERSION,
            d.TRAINJOB.kind,
            md["name"],
            md["namespace"],
            {"trainerStatus": ts},
        )
        try:
            await apply_status(self.trainjobs.api, body, field_manager=FIELD_MANAGER)
        except Conflict as e:
            log.info("%s: status.trainerStatus is managed by another manager: %s", key, e)
            self._trainer_conflicts.add(key)
        except NotFound:
            pass
