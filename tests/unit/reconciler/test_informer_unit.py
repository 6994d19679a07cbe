"""Informer logic against a scripted stand-in for one resource's LIST and WATCH (the real API
server is in tests/integration/reconciler): relist differences, 410 handling, very short watches,
handlers that enqueue keys. Time is a FakeClock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from reconciler.clock import FakeClock
from reconciler.errors import Gone, ServiceUnavailable
from reconciler.informer import EventHandler, Informer, enqueue_keys
from reconciler.resources import CONFIGMAPS, ListResult, WatchEvent
from reconciler.workqueue import WorkQueue


def cm(name: str, rv: int) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


class ScriptedApi:
    """LIST answers and WATCH streams, consumed in order; a watch script item that is an
    exception is raised mid-stream."""

    resource = CONFIGMAPS

    def __init__(self, lists: list[list[dict]], watches: list[list[Any]]) -> None:
        self.lists = lists
        self.watches = watches
        self.watch_rvs: list[str | None] = []

    async def list_all(self, *_: Any, **__: Any) -> ListResult:
        items = self.lists.pop(0)
        rv = max((int(o["metadata"]["resourceVersion"]) for o in items), default=1)
        return ListResult(items, str(rv))

    async def watch(
        self, *_: Any, resource_version: str | None = None, **__: Any
    ) -> AsyncIterator[WatchEvent]:
        self.watch_rvs.append(resource_version)
        script = self.watches.pop(0) if self.watches else None
        if script is None:
            await asyncio.Event().wait()  # nothing more: hang like an idle watch
        for item in script or []:
            if isinstance(item, Exception):
                raise item
            yield item


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def test_relist_after_410_delivers_only_the_differences() -> None:
    clock = FakeClock()
    api = ScriptedApi(
        lists=[
            [cm("a", 1), cm("b", 2), cm("c", 3)],
            [cm("a", 1), cm("b", 7), cm("d", 8)],  # b changed, c deleted, d added, a unchanged
        ],
        watches=[[WatchEvent("BOOKMARK", cm("", 5)), Gone(410, "Expired", "too old")]],
    )
    inf = Informer(api, clock=clock)  # type: ignore[arg-type]
    seen: list[tuple[str, str]] = []
    inf.add_handler(
        EventHandler(
            on_add=lambda o: seen.append(("add", o["metadata"]["name"])),
            on_update=lambda old, new: seen.append(("update", new["metadata"]["name"])),
            on_delete=lambda o: seen.append(("delete", o["metadata"]["name"])),
        )
    )
    task = asyncio.create_task(inf.run())
    await settle()
    assert seen[:3] == [("add", "a"), ("add", "b"), ("add", "c")]
    assert seen[3:] == [("update", "b"), ("add", "d"), ("delete", "c")]
    assert api.watch_rvs == ["3", "8"], "watched from each list's resourceVersion"
    assert inf.stats.gone == 1 and inf.stats.relists == 1
    assert dict(inf.stats.synthetic) == {"update": 1, "add": 1, "delete": 1}
    assert sorted(inf.store.keys()) == ["ns/a", "ns/b", "ns/d"]
    task.cancel()


async def test_resumes_from_last_rv_and_backs_off_on_errors_and_short_watches() -> None:
    clock = FakeClock()
    api = ScriptedApi(
        lists=[[cm("a", 1)]],
        watches=[
            [WatchEvent("MODIFIED", cm("a", 4)), ServiceUnavailable(503)],
            [],  # closes at once with nothing: a very short watch
            [WatchEvent("DELETED", cm("a", 9))],
        ],
    )
    inf = Informer(api, clock=clock)  # type: ignore[arg-type]
    task = asyncio.create_task(inf.run())
    await settle()
    assert api.watch_rvs == ["1"] and inf.stats.watch_errors == 1
    clock.step(0.96)  # the first backoff is 0.8 s plus up to 20 % jitter
    await settle()
    assert api.watch_rvs == ["1", "4"], "resumed from the last event's resourceVersion"
    assert inf.stats.watch_errors == 2, "an empty watch closing at once counts as a failure"
    clock.step(1.92)
    await settle()
    # The third watch delivers a deletion and ends normally: watched again at once, from it.
    assert api.watch_rvs == ["1", "4", "4", "9"]
    assert len(inf.store) == 0 and inf.stats.lists == 1 and inf.stats.watch_restarts == 3
    task.cancel()


async def test_enqueue_keys_handler() -> None:
    q: WorkQueue[str] = WorkQueue(clock=FakeClock())
    h = enqueue_keys(q)
    assert h.on_add and h.on_update and h.on_delete
    h.on_add(cm("a", 1))
    h.on_update(cm("a", 1), cm("a", 2))
    h.on_delete({"metadata": {"name": "node1"}})
    assert [q.try_get(), q.try_get()] == ["ns/a", "node1"]
