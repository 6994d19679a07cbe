"""The push endpoint's 409, 429 and 503 on the real control plane, each with real pod-bound tokens
the API server reviews: a job whose TrainingProgress is controlled by something else (409), new
tokens beyond the review budget (429 with Retry-After), a replica that is not the leader and whose
caches have not synced (503 with Retry-After). Each answer is a Kubernetes Status that says why,
and leaves the TrainingProgress as it was. (Served over plain HTTP in process: the TLS serving is
test_progress_push.py's.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from progress_support import (
    controller_ref,
    eventually,
    get_json,
    get_tp,
    progress,
    running_controller,
    start_job,
    write_atomic,
)

from localcluster import LocalCluster
from progress_controller import discovery as d
from progress_controller.controller import TRAININGPROGRESSES, ProgressController
from progress_controller.push import PushEndpoint, push_path
from progress_controller.push_auth import PUSH_AUDIENCE, PushAuth
from reconciler.client import Client
from reconciler.manager import Manager

# Long enough for a wrongly accepted push to have been written (the controller reconciles a
# pushed job at once; FAST polls every second).
SETTLE = 2.5


def pod_token(
    cluster: LocalCluster, ns: str, pod: dict, minutes: int = 10, audience: str | None = None
) -> str:
    """A ServiceAccount token bound to `pod` as the kubelet projects one; a different lifetime
    makes a different token (10 minutes is the API server's least)."""
    md = pod["metadata"]
    args = ["create", "token", pod["spec"].get("serviceAccountName") or "default", "-n", ns]
    args += ["--bound-object-kind=Pod", f"--bound-object-name={md['name']}"]
    args += [f"--bound-object-uid={md['uid']}", f"--duration={minutes}m"]
    args.append(f"--audience={audience or PUSH_AUDIENCE}")
    return cluster.kubectl(*args).stdout.strip()


@contextlib.asynccontextmanager
async def serving(endpoint: PushEndpoint) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(endpoint.app())) as http:
        try:
            yield http
        finally:
            await endpoint.auth.close()


async def push(
    http: TestClient, url: str, body: bytes, bearer: str
) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"}
    async with http.post(url, data=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.json()


def assert_status(body: dict[str, Any], code: int, reason: str, words: str) -> None:
    """A Kubernetes Status of this code and reason whose message says `words`."""
    assert body["kind"] == "Status" and body["apiVersion"] == "v1", body
    assert body["status"] == "Failure" and body["code"] == code, body
    assert body["reason"] == reason and words in body["message"], body


async def status_of(client: Client, ns: str, name: str) -> dict[str, Any]:
    return ((await get_tp(client, ns, name)) or {}).get("status") or {}


async def test_a_job_whose_training_progress_is_not_ours_is_409_and_untouched(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    # A TrainingProgress named after the job and naming it in jobRef, but controlled by a
    # ConfigMap: not the job's, so not ours to write (and not a deleted job's that will go).
    kwok.kubectl("create", "configmap", "holder", "-n", ns)
    holder = get_json(kwok, "configmap", "holder", ns)
    ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train"}
    owners = [controller_ref(holder)]
    await client.api(TRAININGPROGRESSES).create(
        {
            "apiVersion": TRAININGPROGRESSES.api_version,
            "kind": TRAININGPROGRESSES.kind,
            "metadata": {"name": "train", "namespace": ns, "ownerReferences": owners},
            "spec": {"jobRef": ref},
        }
    )
    kwok.kubectl(
        "patch", "trainingprogress.kubeckpt.io", "train", "-n", ns, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": {"step": 3}}),
    )  # fmt: skip
    start_job(kwok, ns, "train", progress(1))
    key = d.job_key(d.PYTORCHJOB, ns, "train")
    async with running_controller(client) as ctrl:
        # The endpoint sees the job and its pod in the caches (else 404 or 403, not 409).
        await eventually(
            lambda: (
                ctrl.job(key)[0] is not None
                and ctrl.pods.store.get(f"{ns}/train-master-0") is not None
            ),
            "the job and its pod cached",
            90,
        )
        pod = get_json(kwok, "pod", "train-master-0", ns)
        before = await get_tp(client, ns, "train")
        assert before is not None and before["status"]["step"] == 3
        async with serving(PushEndpoint(ctrl, PushAuth(ctrl.client))) as http:
            url = push_path(d.PYTORCHJOB, ns, "train")
            code, _, body = await push(http, url, progress(99), pod_token(kwok, ns, pod))
        assert code == 409, body
        assert_status(body, 409, "Conflict", "does not write one it does not own")
        assert "PyTorchJob " + ns + "/train" in body["message"]
        await asyncio.sleep(SETTLE)
        after = await get_tp(client, ns, "train")
        assert after is not None
        assert after["status"] == before["status"]
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        # Nor did the push make one of ours beside it.
        tps = await client.api(TRAININGPROGRESSES).list(ns)
        assert [t["metadata"]["name"] for t in tps["items"]] == ["train"]


async def test_429_beyond_the_review_budget_and_503_off_the_leader_change_nothing(
    kwok: LocalCluster, client: Client, namespace: str
) -> None:
    ns = namespace
    path = start_job(kwok, ns, "train", progress(1))
    url = push_path(d.PYTORCHJOB, ns, "train")
    async with running_controller(client) as ctrl:

        async def step_is(step: int, source: str) -> bool:
            st = await status_of(client, ns, "train")
            return st.get("step") == step and st.get("source") == source

        await eventually(lambda: step_is(1, "exec"), "the first exec read", 90)
        pod = get_json(kwok, "pod", "train-master-0", ns)
        # Seven distinct real tokens of the job's own pod, all of our audience but two.
        good, *fresh = [pod_token(kwok, ns, pod, minutes) for minutes in range(10, 15)]
        wrong = [pod_token(kwok, ns, pod, m, audience="https://kubernetes") for m in (10, 11)]
        # A budget of three new tokens, refilled once in 1000 s: nothing refills in the test.
        auth = PushAuth(ctrl.client, rate=0.001, burst=3)
        async with serving(PushEndpoint(ctrl, auth)) as http:
            write_atomic(path, progress(50))  # the file agrees, as the runtime writes both
            assert (await push(http, url, progress(50), good))[0] == 200
            await eventually(lambda: step_is(50, "push"), "the push recorded", 30)
            for tok in wrong:  # the rest of the budget, spent on tokens the API server refuses
                code, _, body = await push(http, url, progress(99), tok)
                assert code == 401, body
            assert auth.stats["reviews"] == 3
            for tok in fresh:
                code, headers, body = await push(http, url, progress(99), tok)
                assert code == 429, body
                assert headers.get("Retry-After") == "1"
                assert_status(body, 429, "TooManyRequests", "too many new tokens")
            assert auth.stats == {"reviews": 3, "cached": 0, "joined": 0, "over_budget": 4}
            await asyncio.sleep(SETTLE)
            assert (await status_of(client, ns, "train")).get("step") == 50
            # A token already reviewed is answered from the cache, budget or not.
            write_atomic(path, progress(51))
            assert (await push(http, url, progress(51), good))[0] == 200
            assert auth.stats["reviews"] == 3 and auth.stats["cached"] == 1
            await eventually(lambda: step_is(51, "push"), "the cached token's push", 30)

        # A second replica that does not lead: never started, so its caches never synced.
        follower = ProgressController(Manager(client, name="progress-follower", port=None))
        assert not follower.manager.is_leader and not follower.manager.synced
        before = await status_of(client, ns, "train")
        async with serving(PushEndpoint(follower, PushAuth(client))) as http:
            code, headers, body = await push(http, url, progress(98), fresh[0])
        assert code == 503, body
        assert headers.get("Retry-After") == "1"
        assert_status(body, 503, "ServiceUnavailable", "not the leader")
        await asyncio.sleep(SETTLE)
        assert (await status_of(client, ns, "train")).get("step") == before.get("step") == 51
