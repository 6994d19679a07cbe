"""Per-job Prometheus gauges of the progress controller, declared once.

`JOB_GAUGES` names every per-job series the controller exports; the Grafana dashboard's queries
are checked against it (tests/unit/test_dashboard.py), so a renamed metric fails a test instead
of leaving an empty panel. `job_samples` is pure (a TrainingProgress status in, values out); the
collector reads the controller's cache at scrape time, so a job's series go with the job. It is
handed the functions it reads through (`ProgressCollector`), so it knows nothing of the
controller that builds it.

The labels are `namespace` and `job` (the training job's). Both collide with the target labels
Prometheus adds itself, so the ServiceMonitor in config/prometheus sets `honorLabels: true`, as
kube-state-metrics' does for the same reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kubeckpt_api.status import STALLED, condition
from kubeckpt_api.status_bounds import eta_seconds
from trainer_runtime.contract.progress import parse_rfc3339

LABELS = ("namespace", "job")


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _eta(st: dict, now: float) -> float | None:
    return eta_seconds(st.get("estimatedTimeRemaining"))


def _since_checkpoint(st: dict, now: float) -> float | None:
    when = (st.get("checkpointing") or {}).get("latestCheckpointTime")
    try:
        return now - parse_rfc3339(when).timestamp() if when else None
    except ValueError:
        return None


def _ckpt(key: str) -> Callable[[dict, float], float | None]:
    return lambda st, now: _float((st.get("checkpointing") or {}).get(key))


def _life(key: str) -> Callable[[dict, float], float | None]:
    # status.lifetime (lifetime.py): the job's totals across its training processes.
    def value(st: dict, now: float) -> float | None:
        life = st.get("lifetime")
        return _float(life.get(key)) if isinstance(life, dict) else None

    return value


def _field(key: str) -> Callable[[dict, float], float | None]:
    return lambda st, now: _float(st.get(key))


def _stalled(st: dict, now: float) -> float:
    # Present for every job (0 or 1), so `sum(kubeckpt_training_stalled)` is 0, not empty.
    return (
        1.0
        if (condition(st.get("conditions") or [], STALLED) or {}).get("status") == "True"
        else 0.0
    )


# name -> (help, value from a TrainingProgress status and the time now; None: no sample)
JOB_GAUGES: dict[str, tuple[str, Callable[[dict, float], float | None]]] = {
    "kubeckpt_training_step": ("Current step", _field("step")),
    "kubeckpt_training_total_steps": ("Steps the run will take", _field("totalSteps")),
    "kubeckpt_training_percent_complete": ("Percent complete", _field("percentComplete")),
    "kubeckpt_training_loss": ("Latest loss", _field("loss")),
    "kubeckpt_training_step_seconds": ("Seconds per step, recent average", _field("stepSeconds")),
    "kubeckpt_training_eta_seconds": ("Estimated seconds remaining", _eta),
    "kubeckpt_training_stalled": ("1 while the job is Stalled (no step for too long)", _stalled),
    "kubeckpt_seconds_since_last_checkpoint": (
        "Seconds since the latest complete checkpoint",
        _since_checkpoint,
    ),
    "kubeckpt_checkpoints_created": (
        "Checkpoints the job has completed over its life, across restarts",
        _ckpt("checkpointsCreated"),
    ),
    "kubeckpt_training_interruptions": (
        "Training processes after the first (preemptions, evictions, crashes, suspensions)",
        _life("interruptions"),
    ),
    "kubeckpt_training_resumes": (
        "Training processes that resumed from a checkpoint",
        _life("resumes"),
    ),
    "kubeckpt_training_steps_lost": (
        "Steps lost over all interruptions (the last step read minus the step resumed at)",
        _life("stepsLost"),
    ),
    "kubeckpt_training_seconds_lost": (
        "Seconds of training lost over all interruptions (downtime plus lost steps' time)",
        _life("secondsLost"),
    ),
    "kubeckpt_checkpoint_save_seconds": (
        "Seconds the latest checkpoint took to become durable",
        _ckpt("lastSaveSeconds"),
    ),
    "kubeckpt_checkpoint_stall_seconds": (
        "Seconds training was held up by the latest checkpoint",
        _ckpt("lastStallSeconds"),
    ),
    "kubeckpt_checkpoint_failed_saves": ("Checkpoints that failed", _ckpt("failedSaves")),
}

# name (without the _total Prometheus adds) -> (stats key, help)
CONTROLLER_COUNTERS: dict[str, tuple[str, str]] = {
    "kubeckpt_progress_reads": ("reads", "Progress reads through pods/exec"),
    "kubeckpt_progress_writes": ("writes", "TrainingProgress status writes"),
    "kubeckpt_progress_skipped_writes": (
        "skipped_writes",
        "Reads that changed nothing, so nothing was written",
    ),
    "kubeckpt_progress_annotation_writes": (
        "annotation_writes",
        "Pod patches of the last-checkpoint annotations",
    ),
}


# The push endpoint's (push.py) counters, exported by every replica (a follower answers 503s).
PUSHES = "kubeckpt_progress_pushes"  # by `code`: 200, or the refusal's HTTP status
# name (without _total) -> (ReviewBudget.stats key, help)
PUSH_REVIEW_COUNTERS: dict[str, tuple[str, str]] = {
    "kubeckpt_progress_push_token_reviews": ("reviews", "TokenReviews sent for push tokens"),
    "kubeckpt_progress_push_token_cache_hits": (
        "cached",
        "Push tokens answered from the review cache (no TokenReview)",
    ),
    "kubeckpt_progress_push_token_joined": (
        "joined",
        "Push tokens answered by a TokenReview of the same token already in flight",
    ),
    "kubeckpt_progress_push_budget_refusals": (
        "over_budget",
        "Pushes refused 429: new tokens beyond the TokenReview budget",
    ),
}
PUSH_SECONDS = "kubeckpt_progress_push_seconds"  # histogram: push.py declares it
JOB_FEEDS = "kubeckpt_progress_jobs"  # gauge by `feed`: push (fresh pushes) or poll (exec)


def job_samples(status: dict, now: float) -> dict[str, float]:
    """The per-job gauge values a TrainingProgress status gives (absent fields: no sample)."""
    out = {}
    for name, (_, value) in JOB_GAUGES.items():
        if (v := value(status, now)) is not None:
            out[name] = v
    return out


# (namespace, job, TrainingProgress status) of every job that still exists
JobStatuses = Callable[[], Iterable[tuple[str, str, dict]]]


class ProgressCollector(Collector):
    """Reads the controller's cache at scrape time (`statuses`): only jobs that still exist have
    series, and only the leader (`leading`) has them. A follower's cache holds the same statuses
    (the leader's writes); exporting them too would double every job's series under the
    replicas' pod labels. `counters` are the controller's running totals (CONTROLLER_COUNTERS'
    keys); `feeds`, the running jobs by what feeds them (`push`, `poll`), also the leader's
    only."""

    def __init__(
        self,
        statuses: JobStatuses,
        counters: Mapping[str, int],
        leading: Callable[[], bool],
        feeds: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.statuses = statuses
        self.counters = counters
        self.leading = leading
        self.feeds = feeds

    def collect(self) -> Iterator[Any]:
        fams = {
            name: GaugeMetricFamily(name, help_, labels=list(LABELS))
            for name, (help_, _) in JOB_GAUGES.items()
        }
        now = time.time()
        for namespace, job, status in self.statuses() if self.leading() else ():
            for name, v in job_samples(status, now).items():
                fams[name].add_metric([namespace, job], v)
        yield from fams.values()
        for name, (key, help_) in CONTROLLER_COUNTERS.items():
            yield CounterMetricFamily(name, help_, value=self.counters[key])
        if self.feeds is not None:
            jobs = GaugeMetricFamily(
                JOB_FEEDS,
                "Running jobs by what feeds their status: push (pushes arrive, no exec) or poll",
                labels=["feed"],
            )
            if self.leading():
                for feed, n in self.feeds().items():
                    jobs.add_metric([feed], n)
            yield jobs


class PushCollector(Collector):
    """The push endpoint's totals at scrape time: pushes by answer (`codes`: HTTP status ->
    count) and its token reviews (`reviews`: ReviewBudget.stats)."""

    def __init__(self, codes: Mapping[int, int], reviews: Mapping[str, int]) -> None:
        self.codes = codes
        self.reviews = reviews

    def collect(self) -> Iterator[Any]:
        pushes = CounterMetricFamily(
            PUSHES, "Progress pushes by answer (200, or the refusal's HTTP status)", labels=["code"]
        )
        for code, n in sorted(self.codes.items()):
            pushes.add_metric([str(code)], n)
        yield pushes
        for name, (key, help_) in PUSH_REVIEW_COUNTERS.items():
            yield CounterMetricFamily(name, help_, value=self.reviews[key])
