"""Every field the controller reads survives the cache trim (progress_controller/trim.py): the
controller's reconcile on trimmed caches makes the same reads (pod, container, argv), status
writes, Events, trainerStatus writes and pod patches, and returns the same result, as on whole
objects. Property-based: jobs of both kinds with generated pods (ranks, replacements, deletion,
owners, the webhook's status annotation, env with the contract's variables among others, every
container state, termination messages, big unread fields), a stored status, the namespace's
opt-in and a policy. Also the library part: the informer applies its transform to LIST pages and
to watch events before the cache and the handlers see them."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeckpt_api.groupversion import TRAINING_PROGRESS
from kubeckpt_api.optin import PUSH_CA_ANNOTATION
from progress_controller import controller as controller_module
from progress_controller import discovery as d
from progress_controller.controller import ProgressController
from progress_controller.schedule import PollSettings
from progress_controller.trainjob import TRAINER_SERVER_ENV
from progress_controller.trim import trim_pod
from reconciler.client import Client
from reconciler.clock import FakeClock
from reconciler.config import ClientConfig
from reconciler.controller import Request
from reconciler.exec import ExecResult
from reconciler.informer import EventHandler, Informer
from reconciler.manager import Manager
from reconciler.resources import CONFIGMAPS, ListResult, Resource, WatchEvent
from reconciler.transform import LAST_APPLIED, strip_bookkeeping
from trainer_runtime.contract.jobkinds import (
    COMPLETION_INDEX_LABEL,
    JOBSET_JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    PYTORCHJOB_NAME_LABEL,
    PYTORCHJOB_OPERATOR_LABEL,
    PYTORCHJOB_REPLICA_INDEX_LABEL,
    PYTORCHJOB_REPLICA_TYPE_LABEL,
    PYTORCHJOB_ROLE_LABEL,
)
from trainer_runtime.contract.preemption import (
    LAST_CHECKPOINT_STEP_ANNOTATION,
    LAST_CHECKPOINT_TIME_ANNOTATION,
)

NS, JOB = "team-a", "llama"
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
BIG = "x" * 3000  # unread bulk: what the trim exists to drop
RECORD = json.dumps(
    {
        "step": 42,
        "totalSteps": 100,
        "loss": "0.3",
        "stepSeconds": "0.5",
        "lastUpdateTime": "2026-01-01T11:59:59Z",
        "checkpointing": {
            "enabled": True,
            "latestCheckpoint": "/ckpt/checkpoint-40",
            "latestCheckpointTime": "2026-01-01T11:59:00Z",
            "checkpointsCreated": 4,
        },
    }
)
TRAINJOBS = Resource(d.TRAINJOB.group, d.TRAINJOB.version, d.TRAINJOB.plural, d.TRAINJOB.kind)

managed_fields = st.just(
    [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": BIG}]
)
READ_ENV = [d.PROGRESS_ENV, d.UPDATE_FREQUENCY_ENV, "CHECKPOINT_URI", TRAINER_SERVER_ENV]
env_entries = st.builds(
    lambda read, junk, values, from_ref: [
        *({"name": n, "value": v} for n, v in zip(read, values, strict=False)),
        *({"name": n, "value": BIG} for n in junk),
        *([{"name": d.PROGRESS_ENV, "valueFrom": {"fieldRef": {"fieldPath": "x"}}}] * from_ref),
    ],
    st.lists(st.sampled_from(READ_ENV), unique=True),
    st.lists(st.sampled_from(["HF_TOKEN", "BULK", "PET_NNODES"]), unique=True),
    st.lists(st.sampled_from(["/run/p.json", "/other.json", "7", "0", "x"]), min_size=4),
    st.booleans(),
)
states = st.one_of(
    st.just({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
    st.builds(
        lambda msg, code: {"terminated": {"exitCode": code, "message": msg, "reason": "Error"}},
        st.sampled_from([RECORD, "", "not json", '{"step": -1}']),
        st.sampled_from([0, 1, 143]),
    ),
    st.just({"waiting": {"reason": "ContainerCreating"}}),
)


@st.composite
def containers(draw: Any) -> list[dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(["pytorch", "node", "sidecar"]), unique=True))
    return [
        {
            "name": n,
            "image": "trainer:1",
            "env": draw(env_entries),
            "command": ["bash", "-c", BIG],
            "resources": {"limits": {"cpu": "1"}},
        }
        for n in names
    ]


@st.composite
def pods(draw: Any, kind: d.JobKind, index: int) -> dict[str, Any]:
    labels: dict[str, str] = {}
    rank0 = draw(st.booleans())
    if kind is d.PYTORCHJOB:
        labels[PYTORCHJOB_NAME_LABEL] = JOB
        labels[PYTORCHJOB_OPERATOR_LABEL] = "pytorchjob-controller"
        labels[PYTORCHJOB_REPLICA_TYPE_LABEL] = "master" if rank0 else "worker"
        labels[PYTORCHJOB_REPLICA_INDEX_LABEL] = "0"
        if rank0 and draw(st.booleans()):
            labels[PYTORCHJOB_ROLE_LABEL] = "master"
    else:
        labels[JOBSET_NAME_LABEL] = JOB
        labels[JOBSET_REPLICATED_JOB_LABEL] = "node"
        labels[JOBSET_JOB_INDEX_LABEL] = "0" if rank0 else "1"
        labels[COMPLETION_INDEX_LABEL] = "0"
    if draw(st.booleans()):
        labels[d.INJECTED_LABEL] = "true"
    inject = draw(st.sampled_from([None, "true", "false"]))
    if inject is not None:
        labels["kubeckpt.io/inject"] = inject
    cs = draw(containers())
    annotations: dict[str, str] = {"bulk.example.com/blob": BIG, LAST_APPLIED: BIG}
    status_ann = draw(st.sampled_from([None, "pytorch", "node", "sidecar", "nope", "{bad"]))
    if status_ann == "{bad":
        annotations[d.STATUS_ANNOTATION] = status_ann
    elif status_ann is not None:
        annotations[d.STATUS_ANNOTATION] = json.dumps({"container": status_ann})
    if draw(st.booleans()):  # the webhook's push CA: the pod's to read, not the controller's
        annotations[PUSH_CA_ANNOTATION] = BIG
    if draw(st.booleans()):
        annotations[LAST_CHECKPOINT_STEP_ANNOTATION] = draw(st.sampled_from(["40", "7"]))
        annotations[LAST_CHECKPOINT_TIME_ANNOTATION] = "2026-01-01T11:00:00Z"
    md: dict[str, Any] = {
        "name": f"{JOB}-{index}",
        "namespace": NS,
        "uid": f"uid-{index}",
        "resourceVersion": str(100 + index),
        "creationTimestamp": draw(
            st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"])
        ),
        "labels": labels,
        "annotations": annotations,
        "managedFields": draw(managed_fields),
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": "j", "controller": True}
        ],
    }
    if draw(st.booleans()):
        md["deletionTimestamp"] = "2026-01-01T11:00:00Z"
    statuses = [
        {
            "name": c["name"],
            "state": draw(states),
            "restartCount": draw(st.integers(0, 2)),
            "image": "trainer:1",
            "imageID": BIG,
            "ready": True,
        }
        for c in cs
        if draw(st.booleans())
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {"containers": cs, "volumes": [{"name": "v", "emptyDir": {}}], "nodeName": "n"},
        "status": {
            "phase": draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"])),
            "containerStatuses": statuses,
            "conditions": [{"type": "Ready", "status": "True", "message": BIG}],
            "podIP": "10.0.0.1",
        },
    }


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from([d.PYTORCHJOB, d.TRAINJOB]))
    job = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": JOB,
            "namespace": NS,
            "uid": "job-uid",
            "resourceVersion": "5",
            "managedFields": draw(managed_fields),
            "annotations": {LAST_APPLIED: BIG},
        },
        "spec": {"suspend": draw(st.booleans()), "runPolicy": {"suspend": draw(st.booleans())}},
        "status": {
            "conditions": draw(st.sampled_from([[], [{"type": "Succeeded", "status": "True"}]]))
        },
    }
    prev = draw(
        st.sampled_from(
            [
                None,
                {},
                {
                    "step": 3,
                    "stepSeconds": "0.5",
                    "observedPod": f"{JOB}-0",
                    "checkpointing": {
                        "latestCheckpoint": "/ckpt/checkpoint-3",
                        "latestCheckpointTime": "2026-01-01T10:00:00Z",
                    },
                },
            ]
        )
    )
    return {
        "kind": kind,
        "job": job,
        "pods": [draw(pods(kind, i)) for i in range(draw(st.integers(0, 3)))],
        "prev": prev,
        "ns_label": draw(st.sampled_from([None, "enabled"])),
        "policy": draw(st.booleans()),
        "trainer_status": draw(st.booleans()),
    }


class Effects:
    """Everything a reconcile does, in order."""

    def __init__(self) -> None:
        self.log: list[Any] = []

    async def exec(self, client: Any, ns: str, pod: str, argv: list, **kw: Any) -> ExecResult:
        self.log.append(("exec", ns, pod, argv, kw.get("container")))
        return ExecResult(stdout=RECORD.encode(), exit_code=0)


def _controller(trim: bool, fx: Effects, sc: dict[str, Any]) -> ProgressController:
    client = Client(ClientConfig("http://127.0.0.1:9", qps=None))  # never reached
    manager = Manager(client, port=None)
    ctrl = ProgressController(
        manager, settings=PollSettings(jitter=0.0), exec_fn=fx.exec, trim=trim, clock=FakeClock()
    )

    async def write(key: str, job: Any, tp: Any, prev: Any, dec: Any) -> None:
        events = [(e.type, e.reason, e.message) for e in dec.events]
        fx.log.append(("write", key, copy.deepcopy(dec.status), events))

    async def trainer(key: str, job: Any, status: Any) -> None:
        fx.log.append(("trainerStatus", key, copy.deepcopy(status)))

    async def patch(name: str, body: Any, ns: str, **kw: Any) -> dict:
        fx.log.append(("patch", ns, name, body, kw))
        return {}

    async def create(body: Any) -> dict:
        fx.log.append(("create", body))
        return {**body, "metadata": {**body["metadata"], "uid": "tp-uid", "resourceVersion": "1"}}

    ctrl._write = write  # type: ignore[method-assign]
    ctrl._write_trainer_status = trainer  # type: ignore[method-assign]
    ctrl.pod_api.patch = patch  # type: ignore[method-assign]
    ctrl.tp_api.create = create  # type: ignore[method-assign]
    ctrl.trainjobs.has_trainer_status = sc["trainer_status"]
    ctrl.trainjobs.api = object()
    ctrl.trainjobs.informer = Informer(client.api(TRAINJOBS), name="trainjobs")
    return ctrl


def _load(inf: Informer, obj: dict[str, Any]) -> None:
    """What the informer would cache of `obj` (its transform applied to a fresh copy)."""
    fresh = copy.deepcopy(obj)
    inf.store.put(inf.transform(fresh) if inf.transform else fresh)


def _owned(kind: d.JobKind, job: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` owned as its kind's operator owns its pods (ownership.py): a PyTorchJob directly, a
    TrainJob through a batch Job and a JobSet (their answers are put in the controller's cache)."""
    pod = copy.deepcopy(pod)
    if kind is d.PYTORCHJOB:
        ref = {"apiVersion": kind.api_version, "kind": kind.kind, "name": JOB}
        pod["metadata"]["ownerReferences"] = [
            {**ref, "uid": job["metadata"]["uid"], "controller": True}
        ]
    else:
        ref = {"apiVersion": "batch/v1", "kind": "Job", "name": f"{JOB}-node-0", "uid": "j"}
        pod["metadata"]["ownerReferences"] = [{**ref, "controller": True}]
    return pod


def _fill(ctrl: ProgressController, sc: dict[str, Any]) -> None:
    from progress_controller.ownership import OwnerFacts

    jobs = ctrl.jobs if sc["kind"] is d.PYTORCHJOB else ctrl.trainjobs.informer
    assert jobs is not None
    _load(jobs, sc["job"])
    job_uid = sc["job"]["metadata"]["uid"]
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "name": JOB,
        "uid": "js",
        "controller": True,
    }
    tj = {
        "apiVersion": d.TRAINJOB.api_version,
        "kind": "TrainJob",
        "name": JOB,
        "uid": job_uid,
        "controller": True,
    }
    ctrl.owners._facts["j"] = (OwnerFacts(True, jobset), float("inf"))
    ctrl.owners._facts["js"] = (OwnerFacts(True, tj), float("inf"))
    for pod in [_owned(sc["kind"], sc["job"], p) for p in sc["pods"]]:
        labels = pod["metadata"]["labels"]
        if labels.get(d.INJECTED_LABEL) == "true":
            _load(ctrl.pods, pod)
        for inf in ctrl.bare_pods:
            name_label = (inf.label_selector or "").split(",")[0]
            if name_label in labels and labels.get(d.INJECTED_LABEL) != "true":
                _load(inf, pod)
    ns_labels = {"kubeckpt.io/inject": sc["ns_label"]} if sc["ns_label"] else {}
    _load(
        ctrl.namespaces,
        {"metadata": {"name": NS, "labels": ns_labels, "managedFields": [{"m": BIG}]}},
    )
    if sc["policy"]:
        _load(
            ctrl.policies,
            {
                "metadata": {
                    "name": "p",
                    "namespace": NS,
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                },
                "spec": {"storage": {"uri": "pvc://c/p"}},
            },
        )
    if sc["prev"] is not None:
        tp = {
            "apiVersion": TRAINING_PROGRESS.api_version,
            "kind": TRAINING_PROGRESS.kind,
            "metadata": {
                "name": JOB,
                "namespace": NS,
                "uid": "tp-uid",
                "resourceVersion": "9",
                "ownerReferences": [
                    {
                        "apiVersion": sc["kind"].api_version,
                        "kind": sc["kind"].kind,
                        "name": JOB,
                        "uid": sc["job"]["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "jobRef": {
                    "apiVersion": sc["kind"].api_version,
                    "kind": sc["kind"].kind,
                    "name": JOB,
                }
            },
            "status": sc["prev"],
        }
        _load(ctrl.tps, tp)


class _FixedNow(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return NOW


async def _effects(trim: bool, sc: dict[str, Any]) -> list[Any]:
    fx = Effects()
    ctrl = _controller(trim, fx, sc)
    _fill(ctrl, sc)
    with mock.patch.object(controller_module, "datetime", _FixedNow):
        for _ in range(2):  # a second pass: what the first one left in the controller's state
            result = await ctrl.reconcile(Request.from_key(d.job_key(sc["kind"], NS, JOB)))
            fx.log.append(("result", result))
    await ctrl.client.close()
    return fx.log


def _same(sc: dict[str, Any]) -> list[Any]:
    whole = asyncio.run(_effects(False, sc))
    trimmed = asyncio.run(_effects(True, sc))
    assert trimmed == whole
    return whole


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_the_controller_decides_the_same_on_trimmed_caches(sc: dict[str, Any]) -> None:
    _same(sc)


def _master(
    kind: d.JobKind,
    container: str,
    env: list[dict],
    state: dict,
    name: str = f"{JOB}-0",
    created: str = "2026-01-01T00:00:00Z",
    **md: Any,
) -> dict[str, Any]:
    """A rank-0 pod of `kind` with one injected container, as the generated ones but fixed."""
    if kind is d.PYTORCHJOB:
        labels = {
            PYTORCHJOB_NAME_LABEL: JOB,
            PYTORCHJOB_OPERATOR_LABEL: "pytorchjob-controller",
            PYTORCHJOB_ROLE_LABEL: "master",
        }
    else:
        labels = {
            JOBSET_NAME_LABEL: JOB,
            JOBSET_REPLICATED_JOB_LABEL: "node",
            JOBSET_JOB_INDEX_LABEL: "0",
            COMPLETION_INDEX_LABEL: "0",
        }
    labels[d.INJECTED_LABEL] = "true"
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "100",
            "creationTimestamp": created,
            **md,
            "labels": labels,
            "annotations": {d.STATUS_ANNOTATION: json.dumps({"container": container})},
            "managedFields": [{"fieldsV1": BIG}],
        },
        "spec": {"containers": [{"name": "sidecar"}, {"name": container, "env": env}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": container, "state": state}]},
    }


def test_the_paths_that_read_pod_fields_are_covered() -> None:
    """Fixed scenarios that surely reach each read of a pod field the generated ones may miss:
    the exec (path and container from the env and the status annotation), the termination
    message, and Trainer's status-server variable (which turns the trainerStatus write off)."""
    running = {"running": {}}
    env = [
        {"name": d.PROGRESS_ENV, "value": "/run/p.json"},
        {"name": d.UPDATE_FREQUENCY_ENV, "value": "7"},
        {"name": "BULK", "value": BIG},
    ]
    prev = {"step": 3, "checkpointing": {"latestCheckpoint": "/ckpt/checkpoint-3"}}
    base = {"ns_label": "enabled", "policy": True, "prev": prev}
    for kind, container in ((d.PYTORCHJOB, "pytorch"), (d.TRAINJOB, "node")):
        job = {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "metadata": {"name": JOB, "namespace": NS, "uid": "job-uid", "resourceVersion": "5"},
        }
        sc = {**base, "kind": kind, "job": job, "trainer_status": True}
        sc["pods"] = [_master(kind, container, env, running)]
        effects = _same(sc)
        execs = [e for e in effects if e[0] == "exec"]
        assert execs[0] == ("exec", NS, f"{JOB}-0", ["cat", "/run/p.json"], container)
        assert any(e[0] == "patch" for e in effects)  # last-checkpoint annotations
        assert any(e[0] == "trainerStatus" for e in effects) == (kind is d.TRAINJOB)

        served = [*env, {"name": TRAINER_SERVER_ENV, "value": "https://trainer:8080"}]
        sc["pods"] = [_master(kind, container, served, running)]
        assert not any(e[0] == "trainerStatus" for e in _same(sc))

        # Rank 0 of two: the newest by creation (not by name), unless it is being deleted.
        older = _master(kind, container, env, running, f"{JOB}-b", "2026-01-01T00:00:00Z")
        newer = _master(kind, container, env, running, f"{JOB}-a", "2026-01-01T00:00:09Z")
        sc["pods"] = [older, newer]
        assert next(e[2] for e in _same(sc) if e[0] == "exec") == f"{JOB}-a"
        going = _master(
            kind,
            container,
            env,
            running,
            f"{JOB}-a",
            "2026-01-01T00:00:09Z",
            deletionTimestamp="2026-01-01T00:01:00Z",
        )
        sc["pods"] = [older, going]
        assert next(e[2] for e in _same(sc) if e[0] == "exec") == f"{JOB}-b"

        done = {"terminated": {"exitCode": 0, "message": RECORD}}
        sc["pods"] = [_master(kind, container, env, done)]
        writes = [e for e in _same(sc) if e[0] == "write"]
        assert writes and writes[0][2]["source"] == "terminationMessage"


@settings(max_examples=30, deadline=None)
@given(sc=scenarios())
def test_the_trim_drops_the_bulk(sc: dict[str, Any]) -> None:
    for p in sc["pods"]:
        small = trim_pod(copy.deepcopy(p))
        assert len(json.dumps(small)) < len(json.dumps(p)) / 3
        assert "managedFields" not in small["metadata"]
        assert LAST_APPLIED not in (small["metadata"].get("annotations") or {})
        assert PUSH_CA_ANNOTATION not in (small["metadata"].get("annotations") or {})
        assert small["metadata"]["labels"] == p["metadata"]["labels"]
        assert small["metadata"]["ownerReferences"] == p["metadata"]["ownerReferences"]


# --- the library: the informer's transform ---


class _Api:
    resource = CONFIGMAPS

    def __init__(self) -> None:
        self.transform_seen: Any = None

    async def list_all(self, *_: Any, transform: Any = None, **__: Any) -> ListResult:
        self.transform_seen = transform
        items = [_cm("a", 1), _cm("b", 2)]
        return ListResult([transform(o) for o in items] if transform else items, "2")

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[WatchEvent]:
        yield WatchEvent("MODIFIED", _cm("a", 3))
        yield WatchEvent("DELETED", _cm("b", 4))
        yield WatchEvent("ADDED", _cm("c", 5))
        await asyncio.Event().wait()


def _cm(name: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": str(rv),
            "managedFields": [{"manager": "m", "fieldsV1": BIG}],
            "annotations": {LAST_APPLIED: BIG, "keep": "me"},
        },
        "data": {"k": "v"},
    }


async def test_the_informer_transforms_before_the_cache_and_the_handlers() -> None:
    api = _Api()
    inf = Informer(api, transform=strip_bookkeeping, clock=FakeClock())  # type: ignore[arg-type]
    seen: list[dict[str, Any]] = []
    inf.add_handler(
        EventHandler(
            on_add=seen.append,
            on_update=lambda _old, new: seen.append(new),
            on_delete=seen.append,
        )
    )
    task = asyncio.create_task(inf.run())
    for _ in range(30):
        await asyncio.sleep(0)
    task.cancel()
    assert api.transform_seen is strip_bookkeeping  # applied page by page, in list_all
    assert [o["metadata"]["name"] for o in seen] == ["a", "b", "a", "b", "c"]
    for obj in [*seen, *inf.store]:
        assert "managedFields" not in obj["metadata"]
        assert obj["metadata"]["annotations"] == {"keep": "me"} and obj["data"] == {"k": "v"}
    assert sorted(inf.store.keys()) == ["ns/a", "ns/c"]
    assert inf.last_resource_version == "5"


def test_a_shared_informer_has_one_transform() -> None:
    manager = Manager(Client(ClientConfig("http://127.0.0.1:9")), port=None)
    api = manager.client.api(CONFIGMAPS)
    inf = manager.informer(api, transform=strip_bookkeeping)
    assert manager.informer(api, transform=strip_bookkeeping) is inf
    # A second user without the transform would read fields the cache dropped.
    with pytest.raises(ValueError, match="another transform"):
        manager.informer(api)
