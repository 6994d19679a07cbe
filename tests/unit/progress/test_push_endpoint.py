"""The push endpoint's answers with the controller's caches faked: which refusal for which case,
and that nothing reaches the controller unless every check passed (the cluster test,
tests/integration/progress/test_progress_push.py, runs the real thing)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from progress_controller import discovery as d
from progress_controller.push import PushEndpoint, push_path
from progress_controller.push_auth import PodIdentity, Refusal
from trainer_runtime.contract.progress import ProgressRecord

NS, JOB = "team", "train"
POD = "train-master-0"
KEY = d.job_key(d.PYTORCHJOB, NS, JOB)
LABELS = {
    "kubeckpt.io/injected": "true",
    "training.kubeflow.org/job-name": JOB,
    "training.kubeflow.org/operator-name": "pytorchjob-controller",
    "training.kubeflow.org/replica-type": "master",
}


class Store:
    def __init__(self, items: dict[str, Any]) -> None:
        self.items = items

    def get(self, key: str) -> Any:
        return self.items.get(key)


class Informer:
    def __init__(self, items: dict[str, Any]) -> None:
        self.store = Store(items)


class Owners:
    def __init__(self, owned: bool) -> None:
        self.owned = owned

    async def split(self, pods: list, job: Any, kind: Any) -> tuple[list, dict[str, str]]:
        return (pods, {}) if self.owned else ([], {POD: "no controller ownerReference"})


class Manager:
    is_leader = True


class FakeController:
    def __init__(self) -> None:
        self.manager = Manager()
        pod = {"metadata": {"name": POD, "namespace": NS, "uid": "uid-1", "labels": LABELS}}
        self.pods = Informer({f"{NS}/{POD}": pod})
        self.jobs = {KEY: {"metadata": {"name": JOB, "namespace": NS, "uid": "job-uid"}}}
        self.owners = Owners(True)
        self.tp: dict | None = {"metadata": {"name": JOB}}
        self.accepted: list[tuple[str, str, ProgressRecord]] = []

        self.cache_ready: bool | None = True

    def job(self, key: str) -> tuple[Any, Any]:
        return self.jobs.get(key), d.PYTORCHJOB

    def job_cache_ready(self, kind: Any) -> bool | None:
        return self.cache_ready

    def _progress(self, key: str, job: Any, kind: Any) -> tuple[Any, bool]:
        return self.tp, False

    def accept_push(self, key: str, pod_uid: str, record: ProgressRecord) -> None:
        self.accepted.append((key, pod_uid, record))


class FakeAuth:
    def __init__(self) -> None:
        self.answer: PodIdentity | Refusal = PodIdentity(NS, "default", POD, "uid-1")

    async def check(self, authorization: str) -> PodIdentity | Refusal:
        return self.answer

    async def close(self) -> None:
        pass


@pytest.fixture
async def setup() -> AsyncIterator[tuple[TestClient, FakeController, FakeAuth]]:
    ctl, auth = FakeController(), FakeAuth()
    endpoint = PushEndpoint(ctl, auth)  # type: ignore[arg-type]
    async with TestClient(TestServer(endpoint.app())) as client:
        yield client, ctl, auth


URL = push_path(d.PYTORCHJOB, NS, JOB)
BODY = json.dumps({"step": 5}).encode()


async def post(client: TestClient, body: bytes = BODY, url: str = URL) -> tuple[int, dict]:
    r = await client.post(url, data=body, headers={"Authorization": "Bearer t"})
    return r.status, await r.json()


async def test_accepted(setup: Any) -> None:
    client, ctl, _ = setup
    code, body = await post(client)
    assert code == 200 and body == {"step": 5}
    assert [(k, u, r.step) for k, u, r in ctl.accepted] == [(KEY, "uid-1", 5)]


async def test_a_trainer_body_without_a_step_is_accepted_and_records_nothing(setup: Any) -> None:
    client, ctl, _ = setup
    body = json.dumps({"trainerStatus": {"progressPercentage": 0}}).encode()
    assert (await post(client, body))[0] == 200
    assert ctl.accepted == []


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (lambda c, a: setattr(a, "answer", Refusal(401, "bad token")), 401, "bad token"),
        (lambda c, a: setattr(a, "answer", Refusal(429, "budget")), 429, "budget"),
        (lambda c, a: setattr(c, "tp", None), 409, "does not write one it does not own"),
        (lambda c, a: setattr(c.manager, "is_leader", False), 503, "not the leader"),
        (lambda c, a: c.jobs.clear(), 404, "not found"),
        # A job missing from a cache that has not synced may exist: retry, not "not found".
        (lambda c, a: (c.jobs.clear(), setattr(c, "cache_ready", False)), 503, "not synced"),
        (lambda c, a: (c.jobs.clear(), setattr(c, "cache_ready", None)), 404, "not served"),
        (lambda c, a: c.pods.store.items.clear(), 403, "is not an injected pod"),
        (
            lambda c, a: setattr(a, "answer", PodIdentity(NS, "default", POD, "uid-old")),
            403,
            "not the pod the token was issued for",
        ),
        (
            lambda c, a: setattr(a, "answer", PodIdentity("other", "default", POD, "uid-1")),
            403,
            "namespace other",
        ),
        (lambda c, a: setattr(c.owners, "owned", False), 403, "no controller ownerReference"),
    ],
)
async def test_refusals_reach_nothing(setup: Any, change: Any, code: int, words: str) -> None:
    client, ctl, auth = setup
    change(ctl, auth)
    got, body = await post(client)
    assert got == code and words in body["message"], body
    assert body["kind"] == "Status" and body["code"] == code
    assert ctl.accepted == []


async def test_another_jobs_url_is_forbidden(setup: Any) -> None:
    client, ctl, _ = setup
    other = d.job_key(d.PYTORCHJOB, NS, "other")
    ctl.jobs[other] = {"metadata": {"name": "other", "namespace": NS, "uid": "o"}}
    code, body = await post(client, url=push_path(d.PYTORCHJOB, NS, "other"))
    assert code == 403 and "does not belong to PyTorchJob other" in body["message"]
    assert ctl.accepted == []


async def test_large_and_hostile_bodies(setup: Any) -> None:
    client, ctl, _ = setup
    assert (await post(client, b"x" * (64 * 1024 + 1)))[0] == 413
    assert (await post(client, b'{"step": NaN}'))[0] == 400
    assert ctl.accepted == []
