from __future__ import annotations

import pytest

from reconciler.cache import Store, label_index, owner_index
from reconciler.clock import FakeClock
from reconciler.objects import micro_time, object_key, parse_time, rfc3339, split_key


def cm(name: str, ns: str = "a", **labels: str) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}}


def test_indexes_follow_updates_and_deletes() -> None:
    s = Store({"app": label_index("app")})
    s.put(cm("x", app="web"))
    s.put(cm("y", app="web"))
    s.put(cm("z", ns="b", app="db"))
    assert s.index_keys("app", "web") == {"a/x", "a/y"}
    s.put(cm("y", app="db"))  # relabelled
    assert s.index_keys("app", "web") == {"a/x"}
    assert s.index_keys("app", "db") == {"a/y", "b/z"}
    s.delete("a/x")
    assert s.index_values("app") == ["db"]
    assert [o["metadata"]["name"] for o in s.list("b")] == ["z"]
    assert len(s) == 2 and "a/y" in s
    s.add_indexers({"owner": owner_index})  # added later: built from what is cached
    assert s.index_keys("owner", "Job/j") == set()
    with pytest.raises(KeyError):
        s.by_index("nope", "x")
    with pytest.raises(ValueError):
        s.add_indexers({"app": label_index("app")})


def test_keys_and_times() -> None:
    assert object_key(cm("x")) == "a/x"
    assert object_key({"metadata": {"name": "node1"}}) == "node1"
    assert split_key("a/x") == ("a", "x") and split_key("node1") == ("", "node1")
    t = parse_time(micro_time())
    assert t.tzinfo is not None
    assert micro_time(t).endswith("Z") and len(micro_time(t)) == len("2024-01-15T10:30:00.000000Z")
    assert len(rfc3339()) == len("2024-01-15T10:30:00Z")


def test_fake_clock_runs_timers_in_order_at_their_instant() -> None:
    clock = FakeClock()
    fired: list[tuple[str, float]] = []
    clock.call_at(2, lambda: fired.append(("b", clock.now())))
    clock.call_at(1, lambda: fired.append(("a", clock.now())))
    cancelled = clock.call_at(1.5, lambda: fired.append(("x", clock.now())))
    cancelled.cancel()
    assert clock.pending() == 2
    clock.step(5)
    assert fired == [("a", 1), ("b", 2)]
    assert clock.now() == 5
    with pytest.raises(ValueError):
        clock.step(-1)
