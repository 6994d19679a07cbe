"""The push endpoint's series on the reconciler's /metrics, read from the exposition: pushes by
answer, TokenReviews sent against cache hits and budget refusals, the handling latency, and the
running jobs fed by push against those polled (the leader's only)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from test_push_endpoint import JOB, KEY, NS, POD, FakeController

from progress_controller import discovery as d
from progress_controller.controller import ProgressController, _JobState
from progress_controller.metrics import ProgressCollector
from progress_controller.push import PushEndpoint, push_path
from progress_controller.push_auth import POD_NAME_EXTRA, POD_UID_EXTRA, PUSH_AUDIENCE, PushAuth
from progress_controller.schedule import PollSettings
from reconciler.client import Client
from reconciler.clock import FakeClock
from reconciler.config import ClientConfig
from reconciler.manager import Manager
from trainer_runtime.contract.progress import ProgressRecord


class ReviewingClient:
    """The API server's TokenReview: `good` is the job's pod's token, anything else invalid."""

    def __init__(self) -> None:
        self.reviews = 0

    async def request(self, method: str, path: str, json_body: dict[str, Any]) -> dict:
        self.reviews += 1
        await asyncio.sleep(0)
        ok = json_body["spec"]["token"] == "good"
        user = {
            "username": f"system:serviceaccount:{NS}:default",
            "extra": {POD_NAME_EXTRA: [POD], POD_UID_EXTRA: ["uid-1"]},
        }
        return {"status": {"authenticated": ok, "audiences": [PUSH_AUDIENCE], "user": user}}


def sample(text: str, name: str) -> float:
    """The value of the sample whose name and labels are `name` (as the exposition writes it)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {name}")


async def test_pushes_by_answer_reviews_against_cache_hits_and_budget_refusals() -> None:
    registry, api = CollectorRegistry(), ReviewingClient()
    auth = PushAuth(api, clock=FakeClock(), rate=0.001, burst=2)
    ctl = FakeController()
    endpoint = PushEndpoint(ctl, auth, registry=registry)  # type: ignore[arg-type]
    url = push_path(d.PYTORCHJOB, NS, JOB)
    body = json.dumps({"step": 5}).encode()
    async with TestClient(TestServer(endpoint.app())) as client:
        codes = []
        for token in ("good", "good", "bad", "other", "good"):
            r = await client.post(url, data=body, headers={"Authorization": f"Bearer {token}"})
            codes.append(r.status)
    # good: reviewed; good: cached; bad: reviewed (the burst of 2 spent); other: 429; good: cached
    assert codes == [200, 200, 401, 429, 200]
    assert api.reviews == 2
    text = generate_latest(registry).decode()
    assert sample(text, 'kubeckpt_progress_pushes_total{code="200"}') == 3
    assert sample(text, 'kubeckpt_progress_pushes_total{code="401"}') == 1
    assert sample(text, 'kubeckpt_progress_pushes_total{code="429"}') == 1
    assert sample(text, "kubeckpt_progress_push_token_reviews_total") == 2
    assert sample(text, "kubeckpt_progress_push_token_cache_hits_total") == 2
    assert sample(text, "kubeckpt_progress_push_token_joined_total") == 0
    assert sample(text, "kubeckpt_progress_push_budget_refusals_total") == 1
    assert sample(text, "kubeckpt_progress_push_seconds_count") == 5
    assert sample(text, "kubeckpt_progress_push_seconds_sum") > 0
    assert sample(text, 'kubeckpt_progress_push_seconds_bucket{le="+Inf"}') == 5
    assert [k for k, _, _ in ctl.accepted] == [KEY] * 3


def feeds_exposition(leading: bool, feeds: dict[str, int]) -> str:
    registry = CollectorRegistry()
    counters = {"reads": 0, "writes": 0, "skipped_writes": 0, "annotation_writes": 0}
    registry.register(ProgressCollector(lambda: [], counters, lambda: leading, feeds=lambda: feeds))
    return generate_latest(registry).decode()


def test_jobs_by_feed_are_the_leaders_only() -> None:
    text = feeds_exposition(True, {"push": 2, "poll": 3})
    assert sample(text, 'kubeckpt_progress_jobs{feed="push"}') == 2
    assert sample(text, 'kubeckpt_progress_jobs{feed="poll"}') == 3
    assert "kubeckpt_progress_jobs{" not in feeds_exposition(False, {"push": 2, "poll": 3})


def test_a_running_job_is_fed_by_push_while_its_pushes_are_fresh() -> None:
    clock = FakeClock()
    manager = Manager(Client(ClientConfig("http://127.0.0.1:9", qps=None)), port=None)
    ctrl = ProgressController(manager, settings=PollSettings(early=5.0), clock=clock)
    manager._leading = True  # as once its caches synced and it leads
    a, b, c = (d.job_key(d.PYTORCHJOB, "team", n) for n in "abc")
    ctrl._state[a] = _JobState(first_seen=0.0, running=True)
    ctrl._state[b] = _JobState(first_seen=0.0, running=True)
    ctrl._state[c] = _JobState(first_seen=0.0)  # not running: neither
    ctrl.accept_push(a, "uid-a", ProgressRecord(step=1))
    ctrl.accept_push(c, "uid-c", ProgressRecord(step=1))
    assert ctrl.job_feeds() == {"push": 1, "poll": 1}
    text = manager.metrics.exposition().decode()
    assert sample(text, 'kubeckpt_progress_jobs{feed="push"}') == 1
    assert sample(text, 'kubeckpt_progress_jobs{feed="poll"}') == 1
    clock.step(10.1)  # past twice the default interval with no push: polled again
    assert ctrl.job_feeds() == {"push": 0, "poll": 2}
