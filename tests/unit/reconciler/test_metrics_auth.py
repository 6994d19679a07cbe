"""/metrics authorization within its own budget: answers cached by a hash of the token (allowed
long, refused briefly, a flood of bad tokens never pushing out a good one), new tokens beyond the
budget answered 429 at once, one review per token however many ask at once, API failures not
cached; and the case the budget exists for: a flood of new bearer tokens on /metrics does not
delay the Lease renewals of the process serving it (a local stand-in API server counts them),
where reviews sharing the elector's client and rate limit did."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from reconciler.client import Client
from reconciler.clock import FakeClock
from reconciler.config import ClientConfig
from reconciler.errors import ServiceUnavailable
from reconciler.leaderelection import LeaderElectionConfig
from reconciler.manager import Manager
from reconciler.metrics_auth import ACCESS_REVIEWS, TOKEN_REVIEWS, MetricsAuth

GOOD = "prometheus-token"


def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the API server answers a review: GOOD is user `prom`, allowed; anything else no one."""
    if path == TOKEN_REVIEWS:
        ok = body["spec"]["token"] == GOOD
        user = {"username": "prom", "groups": ["g"]} if ok else {}
        return {"status": {"authenticated": ok, "user": user}}
    return {"status": {"allowed": body["spec"]["user"] == "prom"}}


class CountingClient:
    """A client that answers reviews in process and counts them (optionally failing)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[str] = []
        self.delay = delay
        self.fail = False

    async def request(self, method: str, path: str, *, json_body: Any = None) -> Any:
        self.calls.append(path)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise ServiceUnavailable(503, "down")
        return answer(path, json_body)


def req(token: str | None) -> web.Request:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return make_mocked_request("GET", "/metrics", headers=headers)


async def test_answers_are_cached_by_token_hash_allowed_long_refused_briefly() -> None:
    clock, api = FakeClock(), CountingClient()
    auth = MetricsAuth(api, ttl=60, negative_ttl=5, clock=clock)
    assert await auth.check(req(None)) == (401, "a bearer token is required")
    assert api.calls == []  # no token, no review
    assert (await auth.check(req(GOOD)))[0] == 200
    assert api.calls == [TOKEN_REVIEWS, ACCESS_REVIEWS]
    assert (await auth.check(req("stolen")))[0] == 401
    assert len(api.calls) == 3
    clock.step(4.9)
    assert (await auth.check(req(GOOD)))[0] == 200 and (await auth.check(req("stolen")))[0] == 401
    assert len(api.calls) == 3  # both cached
    clock.step(0.2)
    assert (await auth.check(req("stolen")))[0] == 401 and len(api.calls) == 4  # refusal expired
    clock.step(56)
    assert (await auth.check(req(GOOD)))[0] == 200 and len(api.calls) == 6  # allowance expired
    cached = repr(auth.reviews.good._items) + repr(auth.reviews.refused._items)
    assert GOOD not in cached and "stolen" not in cached  # only hashes are kept


async def test_a_flood_of_new_tokens_is_answered_429_beyond_the_budget() -> None:
    clock, api = FakeClock(), CountingClient()
    auth = MetricsAuth(api, rate=5, burst=20, max_entries=50, clock=clock)
    assert (await auth.check(req(GOOD)))[0] == 200
    codes = [(await auth.check(req(f"t-{i}")))[0] for i in range(1000)]
    assert codes.count(401) == 19 and codes.count(429) == 981  # the burst, then nothing
    assert len(api.calls) == 2 + 19
    clock.step(1.0)
    codes = [(await auth.check(req(f"u-{i}")))[0] for i in range(100)]
    assert codes.count(401) == 5  # the rate: 5 new tokens a second
    # The good token is still answered from its cache, however many bad ones were seen.
    n = len(api.calls)
    assert (await auth.check(req(GOOD)))[0] == 200 and len(api.calls) == n
    assert len(auth.reviews.refused) <= 50


async def test_concurrent_requests_with_one_token_share_one_review() -> None:
    api = CountingClient(delay=0.05)
    auth = MetricsAuth(api, max_in_flight=2)
    results = await asyncio.gather(*(auth.check(req(GOOD)) for _ in range(20)))
    assert {r[0] for r in results} == {200}
    assert api.calls == [TOKEN_REVIEWS, ACCESS_REVIEWS]
    assert auth.stats["joined"] == 19
    # At most max_in_flight different tokens under review at once; the rest 429 at once.
    codes = await asyncio.gather(*(auth.check(req(f"t-{i}")) for i in range(5)))
    assert sorted(c[0] for c in codes) == [401, 401, 429, 429, 429]


async def test_api_failures_are_503_and_not_cached() -> None:
    api = CountingClient()
    auth = MetricsAuth(api, clock=FakeClock())
    api.fail = True
    status, _ = await auth.check(req(GOOD))
    assert status == 503
    api.fail = False
    assert (await auth.check(req(GOOD)))[0] == 200  # asked again


# --- a flood on a live /metrics port while the same process renews its Lease ---


class FakeApiServer:
    """Leases (get, create, replace) and the two reviews, each review taking 20 ms; records
    when each Lease write arrives."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.writes: list[float] = []
        self.reviews = 0

    def app(self) -> web.Application:
        app = web.Application()
        lease = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        app.router.add_get(lease + "/{name}", self.get)
        app.router.add_post(lease, self.create)
        app.router.add_put(lease + "/{name}", self.replace)
        app.router.add_post(TOKEN_REVIEWS, self.review)
        app.router.add_post(ACCESS_REVIEWS, self.review)
        return app

    def _stored(self, body: dict[str, Any]) -> web.Response:
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[body["metadata"]["name"]] = body
        self.writes.append(time.monotonic())
        return web.json_response(body)

    async def get(self, request: web.Request) -> web.Response:
        obj = self.leases.get(request.match_info["name"])
        if obj is None:
            return web.json_response(
                {"kind": "Status", "code": 404, "reason": "NotFound"}, status=404
            )
        return web.json_response(obj)

    async def create(self, request: web.Request) -> web.Response:
        return self._stored(await request.json())

    async def replace(self, request: web.Request) -> web.Response:
        body = await request.json()
        have = self.leases.get(request.match_info["name"])
        if have and have["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            return web.json_response(
                {"kind": "Status", "code": 409, "reason": "Conflict"}, status=409
            )
        return self._stored(body)

    async def review(self, request: web.Request) -> web.Response:
        self.reviews += 1
        await asyncio.sleep(0.02)
        return web.json_response(answer(request.path, await request.json()))


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


RETRY = 0.2  # renew every 0.2 s; the deadline 1 s


async def _flood_while_leading(own_budget: bool) -> tuple[list[float], bool, dict[int, int], int]:
    """Lead, then send 400 requests with new tokens to /metrics (50 at a time) for 3 s.
    Returns the gaps between Lease writes during the flood, whether leadership held, the
    answers by status, and the reviews the API server saw."""
    api = FakeApiServer()
    async with serving(api.app()) as port:
        # The process's client: 5 requests/s, as a tight --qps would make it.
        client = Client(ClientConfig(f"http://127.0.0.1:{port}", qps=5.0, burst=5))
        manager = Manager(
            client,
            port=None,
            metrics_port=0,
            leader_election=LeaderElectionConfig(
                "lease", "ns", lease_duration=1.5, renew_deadline=1.0, retry_period=RETRY
            ),
        )
        assert manager.elector is not None
        if own_budget:
            manager.metrics_auth = MetricsAuth.with_own_client(client)
        else:
            # The old shape: reviews on the same client (and rate limit) as the renewals,
            # without a budget of their own.
            manager.metrics_auth = MetricsAuth(
                manager.elector.client, rate=1e9, burst=10**9, max_in_flight=10**9
            )
        task = asyncio.create_task(manager.run())
        leading: list[bool] = []

        async def sample() -> None:
            while True:
                leading.append(manager.is_leader)
                await asyncio.sleep(0.02)

        try:
            async with asyncio.timeout(10):
                # The manager offers no event for either: polled.
                while not manager.is_leader or manager.bound_metrics_port is None:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            url = f"http://127.0.0.1:{manager.bound_metrics_port}/metrics"
            sampler = asyncio.create_task(sample())
            start = time.monotonic()
            statuses: dict[int, int] = {}
            sem = asyncio.Semaphore(50)
            async with aiohttp.ClientSession() as session:

                async def scrape() -> None:
                    headers = {"Authorization": f"Bearer {uuid.uuid4()}"}
                    async with sem:
                        try:
                            async with session.get(url, headers=headers) as r:
                                statuses[r.status] = statuses.get(r.status, 0) + 1
                        except aiohttp.ClientError:
                            statuses[0] = statuses.get(0, 0) + 1

                flood = [asyncio.create_task(scrape()) for _ in range(400)]
                await asyncio.sleep(3.0)
                for t in flood:
                    t.cancel()
                await asyncio.gather(*flood, return_exceptions=True)
            end = time.monotonic()
            sampler.cancel()
            writes = [start, *(w for w in api.writes if start <= w <= end), end]
            gaps = [b - a for a, b in itertools.pairwise(writes)]
            return gaps, all(leading), statuses, api.reviews
        finally:
            manager.stop()
            await asyncio.wait_for(task, 10)
            await client.close()


async def test_a_flood_of_new_tokens_does_not_delay_lease_renewals() -> None:
    gaps, held, statuses, reviews = await _flood_while_leading(own_budget=True)
    assert held, "leadership was lost during the flood"
    # Renewed every retry period throughout (plus scheduling slack on a busy machine).
    assert max(gaps) < RETRY + 0.5, gaps
    assert statuses.get(429, 0) > 0 and statuses.get(401, 0) > 0, statuses
    assert reviews <= 20 + 5 * 4, reviews  # the budget: burst 20, then 5/s (one review each)

    # Control: the same flood with the reviews on the elector's client and rate limit delays
    # the renewals past the renew deadline. What the separate budget and client prevent.
    gaps, held, statuses, _ = await _flood_while_leading(own_budget=False)
    assert not held or max(gaps) > 1.0, (gaps, statuses)
