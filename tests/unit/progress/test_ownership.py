"""Job identity by ownership: a pod is a job's only if its controller ownerReferences lead to the
job, UID for UID; labels alone (a bare pod labelled as the master) are not enough. The pure
verdict, the resolver's lookups and cache against a fake API, and the RBAC each link needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeckpt_api.jobkinds import JOB_KINDS, PYTORCHJOB, TRAINJOB
from progress_controller.ownership import (
    BATCH_JOB,
    JOBSET,
    OWNER_CHAINS,
    Foreign,
    Lookup,
    Owned,
    OwnerFacts,
    OwnerResolver,
    facts_of,
    verdict,
)
from reconciler.clock import FakeClock
from reconciler.errors import ApiError, NotFound

ROLE = Path(__file__).resolve().parents[3] / "config" / "rbac" / "reconciler_role.yaml"


def ref(api_version: str, kind: str, name: str, uid: str, controller: bool = True) -> dict:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def obj(name: str, uid: str, *owners: dict, namespace: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "ownerReferences": list(owners),
        }
    }


PTJ = obj("llama", "job-uid")
PTJ_REF = ref("kubeflow.org/v1", "PyTorchJob", "llama", "job-uid")
TJ = obj("llama", "tj-uid")
TJ_REF = ref("trainer.kubeflow.org/v1alpha1", "TrainJob", "llama", "tj-uid")
JOBSET_REF = ref("jobset.x-k8s.io/v1alpha2", "JobSet", "llama", "js-uid")
BATCH_REF = ref("batch/v1", "Job", "llama-node-0", "bj-uid")


def nothing_known(uid: str) -> OwnerFacts | None:
    return None


def test_a_pytorchjob_owns_the_pods_its_operator_made() -> None:
    assert verdict(obj("llama-master-0", "p", PTJ_REF), PTJ, PYTORCHJOB, nothing_known) == Owned()


@pytest.mark.parametrize(
    ("owners", "why"),
    [
        ((), "has no controller"),
        ((dict(PTJ_REF, controller=False),), "has no controller"),
        ((dict(PTJ_REF, uid="another-uid"),), "not this job"),  # a predecessor's, or forged
        ((dict(PTJ_REF, name="other"),), "not this job"),
        ((dict(PTJ_REF, kind="TFJob"),), "not this job"),
        ((dict(PTJ_REF, apiVersion="evil.example.com/v1"),), "not this job"),
        ((ref("apps/v1", "ReplicaSet", "rs", "rs-uid"),), "ReplicaSet rs"),
    ],
)
def test_a_pod_with_the_jobs_labels_but_not_its_controller_is_foreign(
    owners: tuple[dict, ...], why: str
) -> None:
    v = verdict(obj("llama-master-0", "p", *owners), PTJ, PYTORCHJOB, nothing_known)
    assert isinstance(v, Foreign) and why in v.why, v


def chain_facts(**overrides: OwnerFacts) -> dict[str, OwnerFacts]:
    facts = {
        "bj-uid": OwnerFacts(True, JOBSET_REF),
        "js-uid": OwnerFacts(True, TJ_REF),
    }
    facts.update(overrides)
    return facts


def test_a_trainjob_owns_its_pods_through_a_batch_job_and_a_jobset() -> None:
    pod = obj("llama-node-0-0", "p", BATCH_REF)
    # Nothing known: the batch Job is looked up first, then the JobSet.
    v = verdict(pod, TJ, TRAINJOB, nothing_known)
    assert isinstance(v, Lookup) and v.link == BATCH_JOB and v.ref["uid"] == "bj-uid"
    assert v.namespace == "ns"
    partial = {"bj-uid": OwnerFacts(True, JOBSET_REF)}
    v = verdict(pod, TJ, TRAINJOB, partial.get)
    assert isinstance(v, Lookup) and v.link == JOBSET and v.ref["uid"] == "js-uid"
    assert verdict(pod, TJ, TRAINJOB, chain_facts().get) == Owned()


@pytest.mark.parametrize(
    ("pod_owner", "facts", "why"),
    [
        (None, {}, "the pod has no controller"),
        # A bare pod claiming the TrainJob itself: JobSet's pods are a batch Job's.
        (TJ_REF, {}, "not a Job"),
        (BATCH_REF, {"bj-uid": OwnerFacts(False)}, "does not exist"),
        # A batch Job the tenant made, controlled by nothing or by something else.
        (BATCH_REF, {"bj-uid": OwnerFacts(True, None)}, "its Job llama-node-0 has no controller"),
        (
            BATCH_REF,
            {"bj-uid": OwnerFacts(True, ref("batch/v1", "CronJob", "c", "c-uid"))},
            "not a JobSet",
        ),
        (BATCH_REF, {"js-uid": OwnerFacts(True, dict(TJ_REF, uid="old"))}, "not this job"),
        (BATCH_REF, {"js-uid": OwnerFacts(False)}, "does not exist"),
    ],
)
def test_a_broken_or_forged_trainjob_chain_is_foreign(
    pod_owner: dict | None, facts: dict[str, OwnerFacts], why: str
) -> None:
    pod = obj("llama-node-0-0", "p", *([pod_owner] if pod_owner else []))
    v = verdict(pod, TJ, TRAINJOB, chain_facts(**facts).get)
    assert isinstance(v, Foreign) and why in v.why, v


def test_a_same_named_object_with_another_uid_is_not_the_owner() -> None:
    replaced = obj("llama-node-0", "new-uid", JOBSET_REF)
    assert facts_of(replaced, "bj-uid") == OwnerFacts(False)
    assert facts_of(None, "bj-uid") == OwnerFacts(False)
    assert facts_of(obj("llama-node-0", "bj-uid", JOBSET_REF), "bj-uid") == OwnerFacts(
        True, JOBSET_REF
    )


class FakeApi:
    def __init__(self, objects: dict[tuple[str, str], Any], calls: list[tuple[str, str]]) -> None:
        self.objects = objects
        self.calls = calls

    async def get(self, name: str, namespace: str) -> dict:
        self.calls.append((name, namespace))
        found = self.objects.get((name, namespace))
        if isinstance(found, Exception):
            raise found
        if found is None:
            raise NotFound(404, "not found")
        return found


class FakeClient:
    def __init__(self, objects: dict[tuple[str, str], Any]) -> None:
        self.objects = objects
        self.calls: list[tuple[str, str]] = []
        self.resources: list[tuple[str, str, str]] = []

    def api(self, res: Any) -> FakeApi:
        self.resources.append((res.group, res.version, res.plural))
        return FakeApi(self.objects, self.calls)


def trainjob_objects() -> dict[tuple[str, str], Any]:
    return {
        ("llama-node-0", "ns"): obj("llama-node-0", "bj-uid", JOBSET_REF),
        ("llama", "ns"): obj("llama", "js-uid", TJ_REF),
    }


async def test_the_resolver_splits_own_and_foreign_pods_with_one_get_per_owner() -> None:
    client = FakeClient(trainjob_objects())
    resolver = OwnerResolver(client, clock=FakeClock())
    real = [obj(f"llama-node-0-{i}", f"p{i}", BATCH_REF) for i in range(3)]
    forged = obj("llama-node-0-x", "px")  # the labels, no owner
    own, foreign = await resolver.split([*real, forged], TJ, TRAINJOB)
    assert own == real and set(foreign) == {"llama-node-0-x"}
    assert client.calls == [("llama-node-0", "ns"), ("llama", "ns")]
    assert ("batch", "v1", "jobs") in client.resources
    assert ("jobset.x-k8s.io", "v1alpha2", "jobsets") in client.resources
    # Known by UID now: the next reconcile makes no call.
    await resolver.split(real, TJ, TRAINJOB)
    assert len(client.calls) == 2


async def test_answers_expire_and_missing_owners_are_asked_again_sooner() -> None:
    clock = FakeClock()
    client = FakeClient({})
    resolver = OwnerResolver(client, clock=clock, ttl=600, missing_ttl=30)
    pod = obj("llama-node-0-0", "p", BATCH_REF)
    v = await resolver.verdict(pod, TJ, TRAINJOB)
    assert isinstance(v, Foreign) and "does not exist" in v.why
    clock.step(10)
    await resolver.verdict(pod, TJ, TRAINJOB)
    assert len(client.calls) == 1
    # The Job appears (it was created after the pod was seen): believed after missing_ttl.
    client.objects.update(trainjob_objects())
    clock.step(21)
    assert await resolver.verdict(pod, TJ, TRAINJOB) == Owned()
    assert len(client.calls) == 3
    clock.step(599)
    await resolver.verdict(pod, TJ, TRAINJOB)
    assert len(client.calls) == 3
    clock.step(2)
    await resolver.verdict(pod, TJ, TRAINJOB)
    assert len(client.calls) == 5


async def test_the_cache_is_bounded() -> None:
    client = FakeClient({})
    resolver = OwnerResolver(client, clock=FakeClock(), max_entries=10)
    for i in range(50):  # pods naming 50 different (missing) Jobs
        pod = obj(f"p{i}", f"p{i}", dict(BATCH_REF, name=f"j{i}", uid=f"u{i}"))
        await resolver.verdict(pod, TJ, TRAINJOB)
    assert len(resolver._facts) <= 10


async def test_an_api_error_is_not_taken_for_a_foreign_pod() -> None:
    client = FakeClient({("llama-node-0", "ns"): ApiError(500, "etcd timeout")})
    resolver = OwnerResolver(client, clock=FakeClock())
    with pytest.raises(ApiError):
        await resolver.verdict(obj("llama-node-0-0", "p", BATCH_REF), TJ, TRAINJOB)
    assert not resolver._facts  # nothing kept: the retry asks again


async def test_a_pytorchjob_pod_needs_no_lookup() -> None:
    client = FakeClient({})
    resolver = OwnerResolver(client, clock=FakeClock())
    own, foreign = await resolver.split(
        [obj("llama-master-0", "p", PTJ_REF), obj("forged-master", "f")], PTJ, PYTORCHJOB
    )
    assert [o["metadata"]["name"] for o in own] == ["llama-master-0"]
    assert foreign == {"forged-master": "the pod has no controller"}
    assert client.calls == []


@pytest.mark.parametrize("kind", JOB_KINDS, ids=lambda k: k.kind)
def test_every_kind_has_a_chain_and_the_role_may_get_each_link(kind) -> None:
    assert kind.kind in OWNER_CHAINS
    docs = [doc for doc in yaml.safe_load_all(ROLE.read_text()) if doc]
    rules = next(doc for doc in docs if doc["kind"] == "ClusterRole")["rules"]
    for link in OWNER_CHAINS[kind.kind]:
        verbs = {
            v
            for r in rules
            if link.group in r["apiGroups"] and link.plural in r["resources"]
            for v in r["verbs"]
        }
        assert verbs == {"get"}, (link, verbs)  # reads only, and no list: nothing cached
