"""The progress controller: PyTorchJobs and TrainJobs with injected pods -> TrainingProgress status.

One reconcile per job (key `discovery.job_key`: the kind is part of it, so same-named jobs of two
kinds stay apart): keep only the pods the job owns (`ownership`: the labels name a job, the
ownerReferences prove it; the others are ignored and reported once), make sure the job's
TrainingProgress exists (found by spec.jobRef and owned by the job; `status_identity` names a new
one), find the rank-0 pod, read its progress (exec while the container runs, the termination message
once it has terminated; a rank-0 pod being deleted is read before its replacement until the
replacement's record is taken: `discovery.read_order`), decide the new status from the stored one
(`decide`, which leaves out values out of range), apply it to /status only when something changed,
then send the events the change means, and put the latest complete checkpoint on every pod of the
job (`lastcheckpoint`: annotations for checkpoint-aware preemption). Decisions are read from the
informers' caches; the only API calls are the exec, the TrainingProgress create, the status apply,
the pods' annotation patches when their values differ, a GET of a TrainJob pod's batch Job and
JobSet the first time they are seen (and Events).

A job is read at most once per interval (`schedule`): pod and job events that arrive sooner are
answered from the cache, except a new rank-0 pod or a terminated container, which are read at
once. Bad input of one job ends in a condition on that job only.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubeckpt_api import status_bounds as bounds
from kubeckpt_api.groupversion import CHECKPOINT_POLICY, TRAINING_PROGRESS
from kubeckpt_api.optin import opted_in, select_policy
from kubeckpt_api.status_identity import owner_uid, progress_names, progress_of
from reconciler.apply import apply_status, status_patch
from reconciler.client import Client
from reconciler.clock import REAL_CLOCK, Clock
from reconciler.controller import Request, Result, generation_changed
from reconciler.errors import AlreadyExists, ApiError, Conflict, KubeError, NotFound
from reconciler.exec import exec_command
from reconciler.fairlimit import Busy
from reconciler.informer import EventHandler
from reconciler.manager import Manager
from reconciler.objects import KubeObject, name_of, namespace_of
from reconciler.resources import NAMESPACES, PODS, Resource
from trainer_runtime.contract.progress import ProgressRecord

from . import discovery as d
from .decide import FIELD_MANAGER, Decision, Event, Observation, changed, decide, foreign_event
from .gone_pods import GonePods
from .kueue_eviction import Eviction, describe_preemptor, eviction_of
from .lastcheckpoint import pod_patch, wanted
from .metrics import ProgressCollector
from .ownership import OwnerResolver
from .reading import ExecFn, ReadError, parse, read_file
from .schedule import (
    ExecLimiter,
    PollSettings,
    poll_interval,
    push_fresh_until,
    stall_after,
    update_period,
)
from .trainjob import TRAINJOB_API_VERSION, TrainJobWatcher, trainer_status, trainer_status_server
from .trim import POD_PAGE_SIZE, strip_bookkeeping, trim_pod
from .workload_boost import workload_job
from .workloads import WorkloadWatcher

log = logging.getLogger("kubeckpt.progress")

PYTORCHJOBS = Resource(
    d.PYTORCHJOB.group, d.PYTORCHJOB.version, d.PYTORCHJOB.plural, d.PYTORCHJOB.kind
)
TRAININGPROGRESSES = TRAINING_PROGRESS.resource
CHECKPOINTPOLICIES = CHECKPOINT_POLICY.resource
JOB_INDEX = "kubeckpt.io/job"
# TrainingProgress objects by the key of the job their spec.jobRef names.
JOB_REF_INDEX = "kubeckpt.io/jobref"
# The pods' last-checkpoint annotations are written under a manager of their own, so that
# managedFields tell them from the TrainingProgress status ("kubeckpt").
ANNOTATION_FIELD_MANAGER = "kubeckpt-last-checkpoint"


def pod_job_index(pod: KubeObject) -> list[str]:
    """Index training pods by the key of the job their labels name (`discovery.job_key`)."""
    key = d.pod_job_key(pod)
    return [key] if key else []


def progress_job_index(tp: KubeObject) -> list[str]:
    """Index TrainingProgress objects by the key of the job their spec.jobRef names."""
    key = d.progress_job_key(tp)
    return [key] if key else []


def pod_to_job(pod: KubeObject) -> list[Request]:
    return [Request.from_key(k) for k in pod_job_index(pod)]


def progress_to_job(tp: KubeObject) -> list[Request]:
    return [Request.from_key(k) for k in progress_job_index(tp)]


def job_requests(kind: d.JobKind) -> Callable[[KubeObject], list[Request]]:
    """Map a job of `kind` to its request (its key carries the kind)."""
    return lambda job: [Request.from_key(d.job_key(kind, namespace_of(job), name_of(job)))]


def _pod_changed(old: KubeObject, new: KubeObject) -> bool:
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    return old.get("status") != new.get("status") or (
        om.get("deletionTimestamp") != nm.get("deletionTimestamp")
    )


def workload_to_job(workload: KubeObject) -> list[Request]:
    """Map a Kueue Workload to the request of the training job that controls it."""
    job = workload_job(workload)
    if job is None:
        return []
    return [Request.from_key(d.job_key(job.kind, namespace_of(workload), job.name))]


def _eviction_changed(old: KubeObject, new: KubeObject) -> bool:
    # The Workload cache keeps only the eviction conditions under status (workloads.py).
    return old.get("status") != new.get("status")


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
    # The latest pushed record not yet decided on, with the UID of the pod that pushed it.
    pushed: tuple[str, ProgressRecord] | None = None
    last_push: float | None = None  # when the latest push arrived (clock time)
    push_interval: float | None = None  # seconds between the last two pushes
    running: bool = False  # its rank-0 pod ran at the last reconcile (read by exec or push)
    # The UID of the pod whose record was taken last: a victim's record (a rank-0 pod being
    # deleted, read before its replacement) is from a new pod when it is another's.
    record_uid: str | None = None


@dataclass
class _Victims:
    """What the victims read before the replacement made (ProgressController._take_victims)."""

    status: dict[str, Any]  # the status after their records (the stored one if none taken)
    events: list[Event]  # the Events their records mean, in order
    runs: bool  # one of them still runs: read again soon
    record_uid: str | None  # the UID of the pod whose record was taken last


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
        workload_interval: float = 30.0,
        trim: bool = True,
        exec_client: Client | None = None,
    ) -> None:
        """`trim`: the caches keep only the fields the controller reads (`trim.py`).
        `exec_client`: the client the execs go through (default: the manager's), so that execs
        and status writes each have a rate budget of their own.
        `workload_interval`: seconds between looks for Kueue's Workload API (workloads.py)."""
        client = manager.client
        self.client = client
        self.settings = settings or PollSettings()
        self.limiter = limiter or ExecLimiter()
        self.exec_fn = exec_fn
        self.exec_client = exec_client or client
        self.exec_timeout = exec_timeout
        self.clock = clock
        self.tp_api = client.api(TRAININGPROGRESSES)
        self.pod_api = client.api(PODS)
        pod_trim, other_trim = (trim_pod, strip_bookkeeping) if trim else (None, None)
        self.jobs = manager.informer(client.api(PYTORCHJOBS), transform=other_trim)
        self.pods = manager.informer(
            client.api(PODS),
            label_selector=f"{d.INJECTED_LABEL}=true",
            indexers={JOB_INDEX: pod_job_index},
            transform=pod_trim,
            page_size=POD_PAGE_SIZE,
        )
        self.tps = manager.informer(self.tp_api, transform=other_trim)
        # Training pods the webhook did not mark, to tell when one should have been injected:
        # one informer per kind's pod label (a label selector cannot OR two labels, and one
        # on `injected!=true` alone would cache every pod in the cluster).
        self.bare_pods = [
            manager.informer(
                client.api(PODS),
                label_selector=f"{label},{d.INJECTED_LABEL}!=true",
                indexers={JOB_INDEX: pod_job_index},
                transform=pod_trim,
                page_size=POD_PAGE_SIZE,
            )
            for label in sorted({k.name_label for k in d.JOB_KINDS})
        ]
        self.namespaces = manager.informer(client.api(NAMESPACES), transform=other_trim)
        self.policies = manager.informer(client.api(CHECKPOINTPOLICIES), transform=other_trim)
        self.tps.add_indexers({JOB_REF_INDEX: progress_job_index})
        self.owners = OwnerResolver(client, clock=clock)
        self.events = manager.event_recorder("kubeckpt-reconciler")
        self.controller = manager.controller("progress", self.reconcile, workers=workers)
        self.controller.watch(self.jobs, job_requests(d.PYTORCHJOB), update_predicate=_job_changed)
        self.controller.watch(self.pods, pod_to_job, update_predicate=_pod_changed)
        # Our own status writes come back as updates: they must not trigger a read.
        self.controller.watch(self.tps, progress_to_job, update_predicate=generation_changed)
        for inf in self.bare_pods:
            self.controller.watch(inf, pod_to_job, update_predicate=lambda o, n: False)
        self._state: dict[str, _JobState] = {}
        # Rank-0 pods deleted with their final record unread (gone_pods.py): the kubelet
        # deletes a pod right after writing the termination message a reconcile would read.
        self.gone = GonePods(clock)
        self.pods.add_handler(EventHandler(on_delete=self.gone.remember))
        # Our last write per job, newer than the cache until the watch delivers it.
        self._written: dict[str, KubeObject] = {}
        # The same for pods' annotations: job key -> pod uid -> (resourceVersion, annotations).
        self._annotated: dict[str, dict[str, tuple[int, dict[str, str]]]] = {}
        self.trainjobs = TrainJobWatcher(
            client,
            lambda inf: self.controller.watch(
                inf, job_requests(d.TRAINJOB), update_predicate=_job_changed
            ),
            interval=trainjob_interval,
        )
        manager.add_runnable(self.trainjobs.run, leader_only=False)
        # Kueue's Workloads (when Kueue is installed): why a suspended job is suspended.
        self.workloads = WorkloadWatcher(client, interval=workload_interval)
        self.workloads.on_informer(
            lambda inf, _api: self.controller.watch(
                inf, workload_to_job, update_predicate=_eviction_changed
            )
        )
        manager.add_runnable(self.workloads.run, leader_only=False)
        self._trainer_conflicts: set[str] = set()
        # Foreign pods reported by an Event on a job that has no TrainingProgress to hold the
        # condition that remembers them: job key -> pod UIDs.
        self._foreign_reported: dict[str, set[str]] = {}
        self.stats = {"reads": 0, "writes": 0, "skipped_writes": 0, "annotation_writes": 0}
        self.pushes = 0  # accepted pushes (push.py); apart from `stats`, which /metrics exports
        self.manager = manager
        manager.metrics.registry.register(
            ProgressCollector(
                self.job_statuses, self.stats, lambda: manager.is_leader, feeds=self.job_feeds
            )
        )

    def accept_push(self, key: str, pod_uid: str, record: ProgressRecord) -> None:
        """A push the endpoint accepted (push.py: token, pod, job and body checked): keep the
        newest record and reconcile the job, which decides and writes it as it would an exec
        read. Pushes that arrive faster than the job is reconciled collapse into the newest
        (the queue holds a key once): at most one status write per reconcile."""
        now = self.clock.now()
        state = self._state.setdefault(key, _JobState(first_seen=now))
        if state.last_push is not None:
            state.push_interval = now - state.last_push
        state.last_push = now
        state.pushed = (pod_uid, record)
        self.pushes += 1
        self.controller.enqueue(Request.from_key(key))

    # --- helpers ---
    def _forget(self, key: str) -> None:
        self._state.pop(key, None)
        self.gone.forget(key)
        self._written.pop(key, None)
        self._annotated.pop(key, None)
        self._trainer_conflicts.discard(key)
        self._foreign_reported.pop(key, None)

    def job(self, key: str) -> tuple[KubeObject | None, d.JobKind]:
        """The job with this key from the caches, and its kind."""
        parsed = d.parse_job_key(key)
        if parsed is None:
            return None, d.PYTORCHJOB
        kind, namespace, name = parsed
        inf = self.jobs if kind is d.PYTORCHJOB else self.trainjobs.informer
        if inf is None:
            return None, kind
        return inf.store.get(f"{namespace}/{name}"), kind

    def job_cache_ready(self, kind: d.JobKind) -> bool | None:
        """Whether the cache of this kind's jobs has synced (a job missing from it is gone);
        None when the kind is not served (its API not found, e.g. TrainJobs without Trainer)."""
        inf = self.jobs if kind is d.PYTORCHJOB else self.trainjobs.informer
        return None if inf is None else inf.has_synced

    def job_statuses(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(namespace, name, status) of each job's TrainingProgress, newest known, for the jobs
        that still exist (what /metrics exports; `name` is the TrainingProgress's, unique in its
        namespace even when two kinds' jobs share a name)."""
        for tp in list(self.tps.store):
            key = d.progress_job_key(tp)
            job = self.job(key)[0] if key else None
            if key is None or job is None or owner_uid(tp) != _uid(job):
                continue
            tp = self.stored(key, tp)
            yield namespace_of(tp), name_of(tp), tp.get("status") or {}

    def job_feeds(self) -> dict[str, int]:
        """Running jobs by what feeds their status now: `push` while their pushes are fresh (no
        exec read meanwhile: schedule.push_fresh_until), else `poll` (exec reads)."""
        now = self.clock.now()
        feeds = {"push": 0, "poll": 0}
        for st in list(self._state.values()):
            if st.running:
                fresh = now < push_fresh_until(st.last_push, st.push_interval, self.settings.early)
                feeds["push" if fresh else "poll"] += 1
        return feeds

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

    def _mine(self, tp: KubeObject | None, key: str, job: KubeObject) -> bool:
        """Whether `tp` is this job's: its jobRef names the job and the job owns it."""
        return tp is not None and d.progress_job_key(tp) == key and owner_uid(tp) == _uid(job)

    def _progress(
        self, key: str, job: KubeObject, kind: d.JobKind
    ) -> tuple[KubeObject | None, bool]:
        """The job's TrainingProgress from the cache (or our own newer write), and whether one
        that names the job belongs to a predecessor of the same name (a deleted job whose
        TrainingProgress the garbage collector has yet to remove)."""
        md = job.get("metadata") or {}
        cached = progress_of(
            self.tps.store.by_index(JOB_REF_INDEX, key), kind, md.get("name", ""), _uid(job)
        )
        if cached and self._mine(cached[0], key, job):
            return cached[0], False
        mine = self._written.get(key)
        if self._mine(mine, key, job):
            return mine, False
        # Owned by another UID: a deleted job's, which the garbage collector removes. One with no
        # owner (made by hand) is not waited for: its name is just taken.
        return None, any(owner_uid(tp) not in (None, _uid(job)) for tp in cached)

    async def _ensure_tp(
        self, key: str, job: KubeObject, kind: d.JobKind
    ) -> tuple[KubeObject | None, bool]:
        """The job's TrainingProgress, created when it has none: named after the job, unless that
        name is another job's (a same-named job of another kind came first), then
        `status_identity.progress_names`' next (an Event on the job says which). Also whether a
        predecessor's is still there (then none is created yet: it is about to go)."""
        tp, predecessor = self._progress(key, job, kind)
        if tp is not None or predecessor:
            return tp, predecessor
        md = job["metadata"]
        ref = {"apiVersion": job.get("apiVersion") or kind.api_version, "kind": kind.kind}
        taken: list[str] = []
        for name in progress_names(md["name"], kind, md["uid"]):
            other = self.tps.store.get(f"{md['namespace']}/{name}")
            if other is not None:
                taken.append(name)
                continue
            body = {
                "apiVersion": TRAINING_PROGRESS.api_version,
                "kind": TRAINING_PROGRESS.kind,
                "metadata": {
                    "name": name,
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
                tp = await self.tp_api.get(name, md["namespace"])
                if not self._mine(tp, key, job):
                    taken.append(name)
                    continue
            self._written[key] = tp
            if taken:
                message = (
                    f"this {kind.kind}'s TrainingProgress is {name}: "
                    f"{', '.join(taken)} belongs to another job of the same name"
                )
                for about in (job, tp):
                    self.events.event(about, "Normal", "TrainingProgressName", message)
            return tp, False
        log.warning("%s: no free TrainingProgress name (%s taken)", key, ", ".join(taken))
        return None, False

    def _not_injected(self, bare_pods: Iterable[KubeObject]) -> list[str]:
        """The job's pods that the webhook should have injected and did not: opted in, a
        matching CheckpointPolicy, no marker (the webhook fails open when it is down)."""
        out = []
        for pod in bare_pods:
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
            async with self.limiter.slot(namespace_of(pod)):
                self.stats["reads"] += 1
                data, _ = await read_file(
                    self.exec_fn,
                    self.exec_client,
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
        if (known_state := self._state.get(key)) is not None:
            # Running only once this reconcile finds its rank-0 pod running: every return
            # before that (no pods left, no TrainingProgress yet) leaves it not running, so
            # that the jobs-by-feed gauge (job_feeds) does not count it meanwhile.
            known_state.running = False
        # The pods whose labels name the job; only those it owns count for anything.
        injected = self.pods.store.by_index(JOB_INDEX, key)
        # By UID: a pod carrying both kinds' labels is in both caches of bare pods.
        bare = list(
            {
                _uid(p): p for inf in self.bare_pods for p in inf.store.by_index(JOB_INDEX, key)
            }.values()
        )
        own, foreign = await self.owners.split([*injected, *bare], job, kind)
        own_uids = {_uid(p) for p in own}
        pods = [p for p in injected if _uid(p) in own_uids]
        gone = self.gone.of(key, {_uid(p) for p in injected})
        if gone:
            # Read (discovery.read_order), never annotated or counted as the job's pods.
            gone_own, _ = await self.owners.split(gone, job, kind)
            pods += gone_own
        missed = self._not_injected(p for p in bare if _uid(p) in own_uids)
        suspended = d.suspended(job, kind)
        if not pods and not missed:
            known, _ = self._progress(key, job, kind)
            if not (suspended and known is not None):
                if known is None:
                    self._report_foreign(key, job, [*injected, *bare], foreign)
                return None  # not an injected job (yet): pod events bring it back
        tp, predecessor = await self._ensure_tp(key, job, kind)
        if tp is None:
            # A predecessor's TrainingProgress is still there: the garbage collector removes it
            # (its job is gone), then ours is created.
            return Result(requeue_after=2.0) if predecessor else None
        tp = self._stored(key, tp)
        prev_status = copy.deepcopy(tp.get("status") or {})
        now = self.clock.now()
        state = self._state.setdefault(key, _JobState(first_seen=now))
        outcome = d.job_outcome(job)
        context = Observation(outcome=outcome, suspended=suspended, job_created=d.created(job))
        if suspended:
            context.eviction, context.preemptor = self._kueue_eviction(job)
        # The replacement last; before it, rank-0 pods being deleted that may still tell of a
        # just-in-time checkpoint (discovery.read_order).
        order = d.read_order(pods, kind, prev_status.get("observedPod"), state.record_uid)
        pod = order[-1] if order else None
        container = d.target_container(pod, kind) if pod is not None else None
        cs = d.container_state(pod, container.get("name", "")) if pod and container else None
        # Known before any read, so that an early return (Busy) leaves it right too.
        running = state.running = cs is not None and cs.state == "running" and outcome is None
        try:
            victims = await self._take_victims(order[:-1], kind, state, prev_status, context)
        except Busy:
            return Result(requeue_after=self.limiter.retry_after())
        hold = False  # a first transient exec failure: keep the stored status as it is
        frequency = d.DEFAULT_UPDATE_FREQUENCY
        if pod is None or container is None or cs is None:
            obs = Observation(outcome=outcome)
            if outcome is None and not suspended and not prev_status.get("observedPod"):
                obs.error_reason = "NoRank0Pod"
                obs.error_message = "no injected rank-0 (master) pod found for the job"
        else:
            frequency = d.update_frequency(container)
            pod_name = name_of(pod)
            pod_uid = (pod.get("metadata") or {}).get("uid")
            if state.pod_uid is not None and pod_uid != state.pod_uid:
                state.new_pod = True
            if cs.state == "terminated":
                obs = _terminated(pod_name, cs.message, outcome)
            elif running:
                pushed, state.pushed = state.pushed, None
                if pushed is not None and pushed[0] != pod_uid:
                    pushed = None  # from a pod that is no longer rank 0 (replaced since)
                # A victim read now is followed by a read of its replacement at once: the
                # replacement's record, when it has one, is to be taken last.
                due = now >= state.next_poll or pod_uid != state.pod_uid or len(order) > 1
                fresh_until = push_fresh_until(
                    state.last_push, state.push_interval, self.settings.early
                )
                if (
                    pushed is None
                    and due
                    and pod_uid == state.pod_uid
                    and len(order) == 1
                    and now < fresh_until
                ):
                    # The pod pushes: no exec while its pushes keep coming; polled again once
                    # the last one is older than twice its interval (schedule.push_fresh_until).
                    due = False
                    state.next_poll = fresh_until
                if pushed is None and not due:
                    # No read, but a pod created since (a restarted rank) gets the annotations.
                    # (No victim was read either: one would have made the read due.)
                    await self._publish_checkpoint(key, prev_status, own)
                    return Result(requeue_after=max(state.next_poll - now, 0.01))
                if pushed is not None:
                    obs = Observation(pod=pod_name, source="push", record=pushed[1])
                else:
                    try:
                        obs = await self._read(pod, container, kind)
                    except Busy:
                        # The namespace has its share of execs in flight (limiter.refused counts
                        # these): read the job later, without holding a worker meanwhile.
                        return Result(requeue_after=self.limiter.retry_after())
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
            rec_step_seconds = bounds.step_seconds(victims.status.get("stepSeconds"))
        period = update_period(rec_step_seconds, frequency)
        if running:
            obs.stall_after = stall_after(self.settings, period)
        obs.not_injected = missed
        obs.suspended = suspended
        obs.eviction, obs.preemptor = context.eviction, context.preemptor
        obs.job_created = context.job_created
        obs.foreign = foreign
        # From the status the victims' records made (the stored one when none was taken).
        decision = decide(victims.status, obs, datetime.now(UTC))
        decision.events[:0] = victims.events
        if hold and victims.status is not prev_status:
            # A victim's record was taken: it is written, without the replacement's transient
            # failure (which the next read decides on).
            hold, decision = False, Decision(victims.status, victims.events)
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
        await self._publish_checkpoint(key, prev_status if hold else decision.status, own)
        state.record_uid = victims.record_uid  # once written (a failed write raises)
        if decision.accepted:
            state.new_pod = False
            state.record_uid = state.pod_uid
        if decision.accepted and obs.record is not None and obs.record.step != state.step:
            state.step = obs.record.step
            state.last_change = now
        if not running:
            # A victim still running is read again soon: its last records (the just-in-time
            # checkpoint) come before it exits, and no pod event tells of them.
            return Result(requeue_after=self.settings.early) if victims.runs else None
        interval = poll_interval(
            self.settings,
            has_record=state.step is not None,
            age=now - state.first_seen,
            since_change=None if state.last_change is None else now - state.last_change,
            period=period,
        )
        # From the end of this look, as the requeue counts: a read that took seconds (a slow or
        # hung `cat`, up to the exec timeout) must not be due again at once when its own write
        # brings the job back, or its jobs would take their namespace's share of the exec
        # slots again before the jobs refused as Busy (back after `retry_after`) ever got one.
        done = self.clock.now()
        state.next_poll = done + interval
        fresh_until = push_fresh_until(state.last_push, state.push_interval, self.settings.early)
        if done < fresh_until:
            # Pushes arrive: the next look is when they would be overdue, not an exec sooner.
            state.next_poll = max(state.next_poll, fresh_until)
            interval = state.next_poll - done
        return Result(requeue_after=interval)

    async def _take_victims(
        self,
        victims: list[KubeObject],
        kind: d.JobKind,
        state: _JobState,
        prev_status: dict[str, Any],
        context: Observation,
    ) -> _Victims:
        """Take the records of the rank-0 pods being deleted (or gone: gone_pods.py) that come
        before the replacement (discovery.read_order), oldest first, each decided on the status
        the one before made. A record decide does not accept, or a victim that tells nothing (a
        failed exec, a bad termination message), changes nothing: the replacement's
        observation, decided after them, sets the conditions. Raises Busy as `_read` does."""
        out = _Victims(prev_status, [], False, state.record_uid)
        for pod in victims:
            obs = await self._read_victim(pod, kind, state)
            if obs is None:
                continue
            out.runs = out.runs or obs.source != "terminationMessage"
            if obs.record is None:
                log.debug("%s: victim %s: %s", name_of(pod), obs.error_reason, obs.error_message)
                continue
            uid = _uid(pod)
            obs.new_pod = out.record_uid is not None and uid != out.record_uid
            obs.outcome, obs.suspended = context.outcome, context.suspended
            obs.eviction, obs.preemptor = context.eviction, context.preemptor
            obs.job_created = context.job_created
            decision = decide(out.status, obs, datetime.now(UTC))
            if decision.accepted:
                out.status, out.record_uid = decision.status, uid
                out.events += decision.events
        return out

    async def _read_victim(
        self, pod: KubeObject, kind: d.JobKind, state: _JobState
    ) -> Observation | None:
        """A victim's record: its termination message once it has terminated, else (it runs)
        the record it pushed last, else its file by exec; None when it has nothing to read."""
        container = d.target_container(pod, kind)
        if container is None:
            return None
        cs = d.container_state(pod, container.get("name", ""))
        if cs.state == "terminated":
            return _terminated(name_of(pod), cs.message)
        if cs.state != "running":
            return None
        if state.pushed is not None and state.pushed[0] == _uid(pod):
            pushed, state.pushed = state.pushed, None
            return Observation(pod=name_of(pod), source="push", record=pushed[1])
        return await self._read(pod, container, kind)

    def _kueue_eviction(self, job: KubeObject) -> tuple[Eviction | None, str | None]:
        """Kueue's eviction of the job (its Workload's conditions, from the cache) and the
        preempting job by name when Kueue named one; (None, None) without Kueue."""
        for wl in self.workloads.of_job(_uid(job)):
            eviction = eviction_of(wl)
            if eviction is not None:
                return eviction, describe_preemptor(eviction, self.workloads.by_uid)
        return None, None

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
        # compares with it and does not send them again. Each on the job and on its
        # TrainingProgress: `kubectl describe tp` is where a user looks for them.
        for ev in dec.events:
            self.events.event(job, ev.type, ev.reason, ev.message)
            self.events.event(written, ev.type, ev.reason, ev.message)

    def _report_foreign(
        self, key: str, job: KubeObject, claimed: list[KubeObject], foreign: dict[str, str]
    ) -> None:
        """A ForeignPod Event for a job with no TrainingProgress (whose PodsOwned condition would
        remember what was reported): once per pod while this controller runs."""
        if not foreign:
            self._foreign_reported.pop(key, None)
            return
        seen = self._foreign_reported.setdefault(key, set())
        new = {
            name_of(p): foreign[name_of(p)]
            for p in claimed
            if name_of(p) in foreign and _uid(p) not in seen
        }
        seen.update(_uid(p) for p in claimed if name_of(p) in foreign)
        if new:
            ev = foreign_event(new)
            self.events.event(job, ev.type, ev.reason, ev.message)

    async def _publish_checkpoint(
        self, key: str, status: dict[str, Any], own: list[KubeObject]
    ) -> None:
        """Make every pod of the job carry its latest complete checkpoint (`lastcheckpoint`).

        Only a pod whose annotations differ is patched: a poll that changes nothing writes
        nothing, and a pod created since (a restarted rank) is written at the next reconcile.
        Never raises: a pod that went or was replaced, or a refused write, must not stall the
        job's status; the next reconcile decides again from what the pod then carries.
        """
        want = wanted(status)
        if want is None:
            return
        # Every pod the job owns, injected or not: a scheduler preempts the job's pods together.
        pods: dict[str, KubeObject] = {uid: p for p in own if (uid := _uid(p))}
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


def _uid(obj: KubeObject | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _terminated(pod: str, message: str, outcome: str | None = None) -> Observation:
    """What a terminated rank-0 container left: the record in its termination message, or why
    that message cannot be read (an empty one says nothing)."""
    obs = Observation(pod=pod, source="terminationMessage", outcome=outcome)
    if message.strip():
        try:
            obs.record = parse(message, "termination message")
        except ReadError as e:
            obs.error_reason, obs.error_message = e.reason, e.message
    return obs
