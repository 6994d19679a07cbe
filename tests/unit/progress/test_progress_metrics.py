"""The progress controller's /metrics collector on its own: the leader exports every existing
job's series and the running totals; a follower exports the totals only."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from progress_controller.metrics import CONTROLLER_COUNTERS, ProgressCollector

STATUS = {
    "step": 40,
    "totalSteps": 100,
    "conditions": [{"type": "Stalled", "status": "True"}],
    "checkpointing": {"checkpointsCreated": 2},
    "lifetime": {"interruptions": 2, "resumes": 1, "stepsLost": 7, "secondsLost": "174.5"},
}
COUNTS = {key: n for n, (key, _) in enumerate(CONTROLLER_COUNTERS.values(), start=1)}


def scrape(leading: bool) -> str:
    registry = CollectorRegistry()
    registry.register(
        ProgressCollector(lambda: [("team-a", "job-1", STATUS)], COUNTS, lambda: leading)
    )
    return generate_latest(registry).decode()


def test_the_leader_exports_each_jobs_series_and_the_totals() -> None:
    text = scrape(leading=True)
    labels = 'job="job-1",namespace="team-a"'
    assert f"kubeckpt_training_step{{{labels}}} 40.0" in text
    assert f"kubeckpt_training_stalled{{{labels}}} 1.0" in text
    assert f"kubeckpt_checkpoints_created{{{labels}}} 2.0" in text
    assert f"kubeckpt_training_interruptions{{{labels}}} 2.0" in text
    assert f"kubeckpt_training_resumes{{{labels}}} 1.0" in text
    assert f"kubeckpt_training_steps_lost{{{labels}}} 7.0" in text
    assert f"kubeckpt_training_seconds_lost{{{labels}}} 174.5" in text
    assert "kubeckpt_training_loss{" not in text  # no loss in the status: no sample
    for name, (key, _) in CONTROLLER_COUNTERS.items():
        assert f"{name}_total {float(COUNTS[key])}" in text


def test_a_follower_exports_no_job_series() -> None:
    text = scrape(leading=False)
    assert "job-1" not in text
    for name, (key, _) in CONTROLLER_COUNTERS.items():
        assert f"{name}_total {float(COUNTS[key])}" in text
