"""Which of the pods that carry a job's labels are the job's own: those its controller created.

Labels are not identity: anyone who may create pods in the namespace can label a bare pod as a
job's master. A pod is the job's only if its controller ownerReference leads to the job, UID for
UID, through the objects the job's operator creates: a PyTorchJob owns its pods itself; a
TrainJob owns a JobSet, which owns batch Jobs, which own the pods. `verdict` decides for one pod
from what is known of the objects in between (pure); `OwnerResolver` fetches those objects when
they are not known yet (a GET per object, its answer kept by UID for a while) and splits a job's
pods into its own and the foreign ones, with why.

What this does not stop: ownerReferences are written by whoever creates the pod, so a tenant
who can read the job's UID can still make a pod (or, for a TrainJob, a batch Job) that claims it
(the README's threat model says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeckpt_api.jobkinds import PYTORCHJOB, TRAINJOB, JobKind
from reconciler.clock import REAL_CLOCK, Clock
from reconciler.errors import NotFound, ResourceNotFound
from reconciler.objects import KubeObject
from reconciler.resources import Resource


@dataclass(frozen=True)
class Link:
    """An object between a pod and its job: the controller of the one below it."""

    group: str
    kind: str
    plural: str


BATCH_JOB = Link("batch", "Job", "jobs")
JOBSET = Link("jobset.x-k8s.io", "JobSet", "jobsets")

# From the pod up to (not including) the job, per kind. tests/unit/progress/test_ownership.py
# checks that every kind of the table has a chain, and the reconciler's RBAC a `get` on each link.
OWNER_CHAINS: Mapping[str, tuple[Link, ...]] = {
    PYTORCHJOB.kind: (),
    TRAINJOB.kind: (BATCH_JOB, JOBSET),
}


@dataclass(frozen=True)
class OwnerFacts:
    """What the controller needs of an object in between: whether the object with that UID exists,
    and its own controller reference."""

    found: bool
    controller: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Owned:
    pass


@dataclass(frozen=True)
class Foreign:
    why: str


@dataclass(frozen=True)
class Lookup:
    """The verdict needs this object first: `ref` (a controller reference) names it."""

    link: Link
    namespace: str
    ref: Mapping[str, Any]


Verdict = Owned | Foreign | Lookup


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with controller: true (at most one is allowed)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def _is(ref: Mapping[str, Any], group: str, kind: str) -> bool:
    api_version = str(ref.get("apiVersion", ""))
    ref_group = api_version.rpartition("/")[0] if "/" in api_version else ""
    return ref.get("kind") == kind and ref_group == group


def _name(ref: Mapping[str, Any]) -> str:
    return f"{ref.get('kind', '?')} {ref.get('name', '?')}"


def verdict(
    pod: KubeObject,
    job: KubeObject,
    kind: JobKind,
    known: Callable[[str], OwnerFacts | None],
) -> Verdict:
    """Whether the job owns `pod`, from the pod's controller reference up its kind's chain to the
    job itself; `known(uid)` is what is known of an object in between (None: not yet)."""
    md = pod.get("metadata") or {}
    ref = controller_ref(pod)
    what = "the pod"
    for link in OWNER_CHAINS.get(kind.kind, ()):
        if ref is None:
            return Foreign(f"{what} has no controller")
        if not _is(ref, link.group, link.kind):
            return Foreign(f"{what} is controlled by {_name(ref)}, not a {link.kind}")
        uid = str(ref.get("uid", ""))
        facts = known(uid)
        if facts is None:
            return Lookup(link, str(md.get("namespace", "")), ref)
        if not facts.found:
            return Foreign(f"its {_name(ref)} (uid {uid}) does not exist")
        what = f"its {_name(ref)}"
        ref = facts.controller
    if ref is None:
        return Foreign(f"{what} has no controller")
    jmd = job.get("metadata") or {}
    if (
        _is(ref, kind.group, kind.kind)
        and ref.get("name") == jmd.get("name")
        and ref.get("uid") == jmd.get("uid")
    ):
        return Owned()
    return Foreign(
        f"{what} is controlled by {_name(ref)} (uid {ref.get('uid', '?')}), not this job"
    )


def facts_of(obj: KubeObject | None, uid: str) -> OwnerFacts:
    """What is kept of a fetched object: a same-named object with another UID is not the owner."""
    if obj is None or (obj.get("metadata") or {}).get("uid") != uid:
        return OwnerFacts(found=False)
    ref = controller_ref(obj)
    return OwnerFacts(found=True, controller=dict(ref) if ref is not None else None)


class OwnerResolver:
    """`split` a job's pods by `verdict`, fetching the objects in between as needed.

    Answers are kept by UID (`ttl` seconds; `missing_ttl` for an object that was not there, which
    a pod whose owner is gone is about to follow), at most `max_entries` of them, so that a job's
    pods cost one GET per Job/JobSet, not one per reconcile. An API error other than NotFound
    raises (the reconcile is retried with backoff): a pod is never called foreign because the API
    server hiccuped.
    """

    def __init__(
        self,
        client: Any,
        *,
        clock: Clock = REAL_CLOCK,
        ttl: float = 600.0,
        missing_ttl: float = 30.0,
        max_entries: int = 4096,
    ) -> None:
        self.client = client
        self.clock = clock
        self.ttl = ttl
        self.missing_ttl = missing_ttl
        self.max_entries = max_entries
        self._facts: dict[str, tuple[OwnerFacts, float]] = {}
        self.fetches = 0

    def _known(self, uid: str) -> OwnerFacts | None:
        entry = self._facts.get(uid)
        if entry is None:
            return None
        if entry[1] <= self.clock.now():
            del self._facts[uid]
            return None
        return entry[0]

    async def _fetch(self, lookup: Lookup) -> None:
        ref = lookup.ref
        uid = str(ref.get("uid", ""))
        version = str(ref.get("apiVersion", "")).rpartition("/")[2]
        res = Resource(lookup.link.group, version, lookup.link.plural, lookup.link.kind)
        self.fetches += 1
        try:
            obj = await self.client.api(res).get(str(ref.get("name", "")), lookup.namespace)
        except (NotFound, ResourceNotFound):
            obj = None
        facts = facts_of(obj, uid)
        while len(self._facts) >= self.max_entries:
            del self._facts[next(iter(self._facts))]  # the oldest answer
        ttl = self.ttl if facts.found else self.missing_ttl
        self._facts[uid] = (facts, self.clock.now() + ttl)

    async def verdict(self, pod: KubeObject, job: KubeObject, kind: JobKind) -> Owned | Foreign:
        # Each lookup adds an answer the next round finds, and a chain is at most a few links.
        for _ in range(len(OWNER_CHAINS.get(kind.kind, ())) + 1):
            v = verdict(pod, job, kind, self._known)
            if not isinstance(v, Lookup):
                return v
            await self._fetch(v)
        v = verdict(pod, job, kind, self._known)
        return v if not isinstance(v, Lookup) else Foreign("its owners could not be looked up")

    async def split(
        self, pods: Iterable[KubeObject], job: KubeObject, kind: JobKind
    ) -> tuple[list[KubeObject], dict[str, str]]:
        """The job's own pods, and the others by name with why they are not."""
        own: list[KubeObject] = []
        foreign: dict[str, str] = {}
        for pod in pods:
            v = await self.verdict(pod, job, kind)
            if isinstance(v, Owned):
                own.append(pod)
            else:
                foreign[str((pod.get("metadata") or {}).get("name", ""))] = v.why
        return own, foreign
