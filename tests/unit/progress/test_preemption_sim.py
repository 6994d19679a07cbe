"""hack/bench/preemption_sim.py: the model of Kueue's victim choice that the lost-work figure in
docs/benchmarks.md rests on, and the figure's core claim at a small, cheap scale."""

from __future__ import annotations

from bench import preemption_sim as sim
from bench.preemption_sim import Candidate, Job, Trace, kueue_victim, make_trace, run


def test_kueue_evicts_the_lowest_effective_priority_first() -> None:
    a = Candidate("a", "uid-a", 100, 30, admitted=10.0)
    b = Candidate("b", "uid-b", 100, 5, admitted=0.0)
    c = Candidate("c", "uid-c", 50, 60, admitted=0.0)  # 110: above b's 105
    assert kueue_victim([a, b, c]).name == "b"


def test_among_equal_priorities_kueue_evicts_the_most_recently_admitted() -> None:
    old = Candidate("old", "uid-0", 100, 0, admitted=100.0)
    new = Candidate("new", "uid-9", 100, 0, admitted=200.0)
    assert kueue_victim([old, new]).name == "new"


def test_admissions_in_the_same_second_fall_back_to_the_lowest_uid() -> None:
    # QuotaReserved's time is a metav1.Time: whole seconds.
    first = Candidate("first", "uid-b", 100, 0, admitted=200.1)
    second = Candidate("second", "uid-a", 100, 0, admitted=200.9)
    assert kueue_victim([first, second]).name == "second"
    assert kueue_victim([second, first]).name == "second"


def test_work_lost_counts_the_steps_since_the_last_checkpoint_or_the_resume() -> None:
    job = Job("j", "u", step_seconds=2.0, interval_steps=100, offset=30, save_seconds=10.0)
    assert (job.step(300.0), job.checkpoint_step(300.0), job.lost_steps(300.0)) == (150, 130, 20)
    assert job.checkpoint_time(300.0) == 260.0
    # Resumed at step 130 at t=1000: the resume point is the checkpoint until step 230.
    job.base_step, job.run_start = 130, 1000.0
    assert job.checkpoint_step(1100.0) == 130 and job.lost_steps(1100.0) == 50
    assert job.checkpoint_step(1220.0) == 230 and job.lost_steps(1220.0) == 10


def test_the_signal_evicts_the_just_checkpointed_job_where_kueue_would_not() -> None:
    # 1 s steps. At the arrival (t=100) `just-saved` (admitted at -5000) is at step 5100, its
    # checkpoint at 5050; `saved-long-ago` (admitted later, at -3000) at step 3100 has none since
    # it started. Polls every ~30 s see just-saved's checkpoint before the arrival.
    common = {"step_seconds": 1.0, "interval_steps": 3600, "save_seconds": 20.0}
    jobs = (
        {"name": "just-saved", "uid": "uid-1", "offset": 1450, "admitted": -5000.0, **common},
        {"name": "saved-long-ago", "uid": "uid-2", "offset": 0, "admitted": -3000.0, **common},
    )
    trace = Trace(jobs, arrivals=(100.0,), holds=(10.0**6,), poll_phase=(0.0, 0.5))
    off, on = run(trace, signal=False), run(trace, signal=True)
    assert off.victims == ["saved-long-ago"]  # Kueue alone: the most recently admitted
    assert off.lost_seconds == [3100.0]
    assert on.victims == ["just-saved"]
    assert on.lost_seconds == [50.0]  # checkpoint at step 5050 (t=50), evicted at step 5100


def test_the_same_seed_gives_the_same_trace_and_the_same_preemptions_off_and_on() -> None:
    kw = {"jobs": 40, "preemptions": 40, "arrival": 60.0, "hold": 1800.0}
    assert make_trace(3, **kw) == make_trace(3, **kw)
    trace = make_trace(3, **kw)
    off, on = run(trace, signal=False), run(trace, signal=True)
    assert len(off.lost_seconds) == len(on.lost_seconds) > 30
    assert on.writes > 0 and off.writes == 0


def test_at_hundred_jobs_the_signal_halves_the_work_lost() -> None:
    """The figure's claim (docs/benchmarks.md), at a scale a unit test affords: one seed."""
    trace = make_trace(1, jobs=100, preemptions=100, arrival=60.0, hold=1800.0)
    off, on = run(trace, signal=False), run(trace, signal=True)
    assert sum(on.lost_seconds) <= 0.5 * sum(off.lost_seconds)


def test_the_model_reads_the_boost_from_the_controllers_own_code() -> None:
    job = Job("j", "u", step_seconds=1.0, interval_steps=3600, offset=0, save_seconds=20.0)
    sim.reconcile(job, 1200.0, sim.CostSettings(), sim.WriteRule())
    assert job.boost == sim.priority_boost(job.progress(1200.0)) > 0
    job.running = False
    sim.reconcile(job, 1201.0, sim.CostSettings(), sim.WriteRule())
    assert job.boost == 0  # Suspended: neutral


def test_in_a_burst_without_readmission_the_signal_halves_the_work_lost_too() -> None:
    trace = make_trace(1, jobs=60, preemptions=40, arrival=60.0, hold=float("inf"))
    off, on = run(trace, signal=False), run(trace, signal=True)
    assert len(off.lost_seconds) == len(on.lost_seconds) == 40
    assert len(set(off.victims)) == len(set(on.victims)) == 40  # nobody comes back
    assert sum(on.lost_seconds) <= 0.5 * sum(off.lost_seconds)
