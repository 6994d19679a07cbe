"""Prometheus metrics, one registry per manager (so two managers in a process, or in tests, never
share or collide). Components keep plain counters; a collector reads them at scrape time, so
they cost nothing between scrapes and work without prometheus. Latencies are histograms."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .client import Client
    from .events import EventRecorder
    from .informer import Informer
    from .leaderelection import LeaderElector
    from .workqueue import WorkQueue


class _StatsCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("workqueue_depth", "Items queued", labels=["name"])
        unfinished = GaugeMetricFamily(
            "workqueue_processing", "Items handed to workers and not done", labels=["name"]
        )
        waiting = GaugeMetricFamily("workqueue_waiting", "Items delayed", labels=["name"])
        adds = CounterMetricFamily("workqueue_adds", "Items added", labels=["name"])
        retries = CounterMetricFamily("workqueue_retries", "Rate-limited re-adds", labels=["name"])
        for name, q in self.m.queues.items():
            depth.add_metric([name], len(q))
            unfinished.add_metric([name], q.processing)
            waiting.add_metric([name], q.waiting)
            adds.add_metric([name], q.adds)
            retries.add_metric([name], q.retries)
        yield from (depth, unfinished, waiting, adds, retries)

        inf_labels = ["informer"]
        fams = {
            "lists": CounterMetricFamily("informer_lists", "LISTs completed", labels=inf_labels),
            "relists": CounterMetricFamily(
                "informer_relists", "LISTs after the first (after 410 Gone)", labels=inf_labels
            ),
            "gone": CounterMetricFamily("informer_gone", "410 Gone on watch", labels=inf_labels),
            "watch_restarts": CounterMetricFamily(
                "informer_watch_restarts", "Watches made again", labels=inf_labels
            ),
            "watch_errors": CounterMetricFamily(
                "informer_watch_errors", "Failed lists and watches", labels=inf_labels
            ),
        }
        events = CounterMetricFamily("informer_events", "Watch events", labels=["informer", "type"])
        objects = GaugeMetricFamily("informer_objects", "Objects cached", labels=inf_labels)
        synced = GaugeMetricFamily("informer_synced", "1 once synced", labels=inf_labels)
        for name, inf in self.m.informers.items():
            for attr, fam in fams.items():
                fam.add_metric([name], getattr(inf.stats, attr))
            for etype, n in inf.stats.events.items():
                events.add_metric([name, etype], n)
            objects.add_metric([name], len(inf.store))
            synced.add_metric([name], 1 if inf.has_synced else 0)
        yield from (*fams.values(), events, objects, synced)

        if self.m.client is not None:
            reqs = CounterMetricFamily(
                "rest_client_requests", "API requests by method and code", labels=["method", "code"]
            )
            for (method, code), n in self.m.client.request_counts.items():
                reqs.add_metric([method, code], n)
            yield reqs
            yield CounterMetricFamily(
                "rest_client_retries", "Retried API requests", value=self.m.client.retries
            )

        ev_labels = ["component", "outcome"]
        ev = CounterMetricFamily("event_recorder_events", "Events by outcome", labels=ev_labels)
        for rec in self.m.recorders:
            for outcome, n in rec.stats.items():
                ev.add_metric([rec.component, outcome], n)
        yield ev

        leader = GaugeMetricFamily(
            "leader_election_master_status", "1 while this instance leads", labels=["name"]
        )
        for name, el in self.m.electors.items():
            leader.add_metric([name], 1 if el.is_leader else 0)
        yield leader


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.queues: dict[str, WorkQueue[Any]] = {}
        self.informers: dict[str, Informer] = {}
        self.recorders: list[EventRecorder] = []
        self.electors: dict[str, LeaderElector] = {}
        self.client: Client | None = None
        self.registry.register(_StatsCollector(self))
        self.reconcile_time = Histogram(
            "controller_reconcile_time_seconds",
            "Time per reconcile",
            ["controller"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.reconcile_total = Counter(
            "controller_reconcile",
            "Reconciles by result (success, error, requeue, requeue_after)",
            ["controller", "result"],
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "controller_reconcile_errors",
            "Reconciles that raised",
            ["controller"],
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "workqueue_queue_duration_seconds",
            "Time an item waited in the queue before a worker took it",
            ["name"],
            registry=self.registry,
        )

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """A sample's current value (tests and status pages)."""
        return self.registry.get_sample_value(name, labels or {})

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
