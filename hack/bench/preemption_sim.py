"""Lost work per preemption with and without kubeckpt's cost signal: a SIMULATION at
hundreds-of-jobs scale (issue 25 item 5), checked against the real Kueue by
kueue_preemption_bench.py at a smaller scale.

What is real here: the boost each job's Workload would carry, computed by the controller's own
pure code (progress_controller.preemption_cost.priority_boost for the value,
progress_controller.workload_boost.decide for whether the writer writes it: its min_change and
min_interval rules), from the job's status as last polled. What is modelled: Kueue's choice of
victim, which is `CandidatesOrdering` in sigs.k8s.io/kueue@v0.17.0
pkg/scheduler/preemption/common/ordering.go, reduced to one ClusterQueue without cohort or
admission fair sharing, where every low-priority job asks for the same one slot:

  1. workloads already evicted first (none here: the trace waits for each eviction);
  2. (other ClusterQueues first: one ClusterQueue here);
  3. (AdmissionFairSharing usage: off);
  4. lower effective priority first: `priority.EffectivePriority`, the base priority plus the
     `kueue.x-k8s.io/priority-boost` annotation (pkg/util/priority/priority.go);
  5. more recently admitted first: the LastTransitionTime of the QuotaReserved condition
     (`quotaReservationTime`), a metav1.Time, so whole seconds;
  6. the Workload UID, ascending ("arbitrary comparison for deterministic sorting").

`classicalPreemptions` (pkg/scheduler/preemption/preemption.go) then removes candidates in that
order until the preemptor fits and adds back what is not needed; for a preemptor that needs one
slot that is exactly the first candidate.

So with the signal off (no boost annotations) Kueue evicts the most recently admitted low job:
a job that was just readmitted after an earlier eviction resumed from its checkpoint and has lost
little, but a job admitted long ago loses whatever it did since its last checkpoint. With the
signal on it evicts the lowest boost, the least work plus save at risk as of the last poll, and
among equal boosts again the most recently admitted.

The trace: N low jobs run from before the trace starts (admitted at random times in the hour
before), each at its own step time, checkpoint interval and save time, its checkpoints at a
random phase. High-priority jobs arrive at exponential gaps; each takes one low job's slot and
holds it for an exponential time (`--hold inf`: for good, a burst of evictions among the jobs
still running, as in kueue_preemption_bench.py without --release); the evicted job is
readmitted (first evicted, first back, as Kueue requeues by eviction time) when a slot frees,
and resumes from its last checkpoint. Lost work per preemption: the steps the victim made since
its last checkpoint (or since it resumed) at the eviction, times its step time. The same seed
gives the same arrivals, holds and jobs with the signal off and on; what differs is only who is
evicted (and so who is readmitted when). A resumed job keeps its checkpoint phase (checkpoints
at fixed step numbers, like HF Trainer's save_steps).

The controller is modelled as it runs: each job's status is polled every `poll` seconds (the
progress controller's `recent` interval, 30 s by default, plus up to 10 % jitter), and the
writer reconciles on each poll; a resumed job's status says it is at its checkpoint, boost 0.

Usage: python hack/bench/preemption_sim.py [--jobs 300] [--preemptions 300] [--rounds 5]
           [--seed 1] [--arrival 60] [--hold 1800|inf] [--poll 30] [--json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path[:0] = [str(REPO), str(REPO / "hack")]

from progress_controller.preemption_cost import (  # noqa: E402
    PRIORITY_BOOST_ANNOTATION,
    CostSettings,
    JobProgress,
    priority_boost,
)
from progress_controller.workload_boost import FIELD_MANAGER, WriteRule, decide  # noqa: E402

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # simulated time 0 as a wall-clock time
LOW_PRIORITY = 100


@dataclass(frozen=True)
class Candidate:
    """An admitted low-priority workload as Kueue's CandidatesOrdering sees it."""

    name: str
    uid: str
    priority: int  # the base priority (the WorkloadPriorityClass value)
    boost: int  # the priority-boost annotation (missing: 0)
    admitted: float  # QuotaReserved's LastTransitionTime, seconds


def victim_order_key(c: Candidate) -> tuple[int, float, str]:
    """Kueue v0.17's CandidatesOrdering within one ClusterQueue (module docstring): the lowest
    effective priority, then the most recently admitted (whole seconds), then the lowest UID."""
    return (c.priority + c.boost, -float(int(c.admitted)), c.uid)


def kueue_victim(candidates: Sequence[Candidate]) -> Candidate:
    """The workload Kueue evicts for a preemptor that needs one slot held by any of them."""
    return min(candidates, key=victim_order_key)


@dataclass
class Job:
    name: str
    uid: str
    step_seconds: float
    interval_steps: int  # steps between periodic checkpoints
    offset: int  # the checkpoints are the steps k with k % interval_steps == offset
    save_seconds: float
    running: bool = True
    run_start: float = 0.0  # when it last started (or resumed)
    base_step: int = 0  # the step it started (resumed) at, which is a checkpoint it has
    admitted: float = 0.0
    created: float = 0.0
    # What the controller knows: the status at the last poll, and the annotation it wrote.
    boost: int | None = None  # the annotation's value (None: absent)
    written_at: float | None = None
    evicted_at: float = 0.0

    def step(self, t: float) -> int:
        return self.base_step + max(0, int((t - self.run_start) / self.step_seconds))

    def checkpoint_step(self, t: float) -> int:
        """The latest checkpoint at t: the latest periodic one, or the one it resumed from."""
        s = self.step(t)
        periodic = s - ((s - self.offset) % self.interval_steps)
        return max(periodic, self.base_step)

    def checkpoint_time(self, t: float) -> float:
        return self.run_start + (self.checkpoint_step(t) - self.base_step) * self.step_seconds

    def lost_steps(self, t: float) -> int:
        return self.step(t) - self.checkpoint_step(t)

    def progress(self, t: float) -> JobProgress:
        """Its TrainingProgress as a poll at t reads it (the controller's JobProgress)."""
        if not self.running:
            return JobProgress(state="Suspended", now=_wall(t), started=_wall(self.created))
        return JobProgress(
            state="Training",
            now=_wall(t),
            started=_wall(self.created),
            step=self.step(t),
            checkpoint_step=self.checkpoint_step(t),
            checkpoint_time=_wall(self.checkpoint_time(t)),
            step_seconds=self.step_seconds,
            save_seconds=self.save_seconds,
        )


def _wall(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


def _rfc3339(t: float) -> str:
    return _wall(t).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload_view(job: Job) -> dict[str, Any]:
    """The Workload's metadata as the writer's informer holds it (workload_boost.trim_workload)."""
    md: dict[str, Any] = {"name": job.name, "namespace": "sim"}
    if job.boost is not None:
        md["annotations"] = {PRIORITY_BOOST_ANNOTATION: str(job.boost)}
        md["managedFields"] = [
            {
                "manager": FIELD_MANAGER,
                "operation": "Apply",
                "time": _rfc3339(job.written_at or 0.0),
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:annotations": {f"f:{PRIORITY_BOOST_ANNOTATION}": {}}}
                },
            }
        ]
    return {"metadata": md}


def reconcile(job: Job, t: float, settings: CostSettings, rule: WriteRule) -> None:
    """One poll and the writer's reconcile that follows it, with the controller's own code."""
    wanted = priority_boost(job.progress(t), settings)
    decision = decide(workload_view(job), wanted, now=_wall(t), rule=rule)
    if decision.write and decision.value is not None:
        job.boost = int(decision.value)
        job.written_at = t


@dataclass(frozen=True)
class Trace:
    """What the same seed gives both runs: the jobs and the high-priority arrivals and holds."""

    jobs: tuple[dict[str, Any], ...]
    arrivals: tuple[float, ...]
    holds: tuple[float, ...]
    poll_phase: tuple[float, ...]


def make_trace(seed: int, *, jobs: int, preemptions: int, arrival: float, hold: float) -> Trace:
    rng = random.Random(seed)
    specs = []
    for i in range(jobs):
        step_seconds = round(rng.uniform(0.5, 5.0), 2)
        interval = rng.uniform(10 * 60, 60 * 60)  # checkpoint every 10 to 60 minutes
        steps = max(1, round(interval / step_seconds))
        specs.append(
            {
                "name": f"low-{i:04d}",
                "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "step_seconds": step_seconds,
                "interval_steps": steps,
                "offset": rng.randrange(steps),
                "save_seconds": round(rng.uniform(10.0, 120.0), 1),
                "admitted": -rng.uniform(0.0, 3600.0),
            }
        )
    t, arrivals = 0.0, []
    for _ in range(preemptions):
        t += rng.expovariate(1 / arrival)
        arrivals.append(t)
    # hold = inf: high jobs never finish, so evicted jobs never return (a burst).
    holds = tuple(rng.expovariate(1 / hold) if math.isfinite(hold) else math.inf
                  for _ in range(preemptions))  # fmt: skip
    phases = tuple(rng.random() for _ in range(jobs))
    return Trace(tuple(specs), tuple(arrivals), holds, phases)


@dataclass
class RunResult:
    signal: bool
    lost_seconds: list[float] = field(default_factory=list)
    victims: list[str] = field(default_factory=list)
    writes: int = 0

    def summary(self) -> dict[str, float]:
        lost = self.lost_seconds
        return {
            "preemptions": len(lost),
            "mean_s": statistics.fmean(lost),
            "median_s": statistics.median(lost),
            "total_s": sum(lost),
        }


def run(
    trace: Trace,
    *,
    signal: bool,
    poll: float = 30.0,
    settings: CostSettings | None = None,
    rule: WriteRule | None = None,
) -> RunResult:
    """Replay the trace; with `signal` the writer keeps each Workload's boost current (with the
    controller's defaults unless `settings` and `rule` are given)."""
    settings, rule = settings or CostSettings(), rule or WriteRule()
    jobs = []
    for spec in trace.jobs:
        job = Job(
            name=spec["name"],
            uid=spec["uid"],
            step_seconds=spec["step_seconds"],
            interval_steps=spec["interval_steps"],
            offset=spec["offset"],
            save_seconds=spec["save_seconds"],
            run_start=spec["admitted"],
            admitted=spec["admitted"],
            created=spec["admitted"],
        )
        jobs.append(job)
    result = RunResult(signal)
    # Events: (time, order, kind, index). Polls only matter with the signal on.
    events: list[tuple[float, int, str, int]] = []
    for i, t in enumerate(trace.arrivals):
        heapq.heappush(events, (t, 1, "arrive", i))
    if signal:
        for i, phase in enumerate(trace.poll_phase):
            heapq.heappush(events, (-poll + phase * poll, 0, "poll", i))
    waiting: list[Job] = []  # evicted, in eviction order
    free = 0  # slots a finished high job left with no evicted job to take them
    poll_rng = random.Random(len(trace.jobs))
    while events:
        t, _, kind, i = heapq.heappop(events)
        if kind == "poll":
            if t > trace.arrivals[-1]:
                continue
            reconcile(jobs[i], t, settings, rule)
            result.writes += 0 if jobs[i].written_at != t else 1
            heapq.heappush(events, (t + poll * (1 + 0.1 * poll_rng.random()), 0, "poll", i))
        elif kind == "arrive" and free:
            free -= 1  # the preemptor fits without evicting anyone
            heapq.heappush(events, (t + trace.holds[i], 2, "free", i))
        elif kind == "arrive":
            running = [j for j in jobs if j.running]
            if not running:
                raise RuntimeError("every low job is already evicted: raise --jobs or lower --hold")
            candidates = [
                Candidate(j.name, j.uid, LOW_PRIORITY, (j.boost or 0) if signal else 0, j.admitted)
                for j in running
            ]
            victim = next(j for j in running if j.name == kueue_victim(candidates).name)
            result.lost_seconds.append(victim.lost_steps(t) * victim.step_seconds)
            result.victims.append(victim.name)
            victim.base_step = victim.checkpoint_step(t)  # it resumes from there
            victim.running = False
            victim.evicted_at = t
            waiting.append(victim)
            if signal:
                reconcile(victim, t, settings, rule)  # Suspended: the writer writes 0
            heapq.heappush(events, (t + trace.holds[i], 2, "free", i))
        elif kind == "free" and waiting:
            job = waiting.pop(0)
            job.running = True
            job.run_start = job.admitted = t
        elif kind == "free":
            free += 1
    return result


def rounds(seeds: Sequence[int], **kw: Any) -> list[tuple[int, dict[str, float], dict[str, float]]]:
    """(seed, off summary, on summary) for each seed: the same trace, signal off then on."""
    out = []
    trace_kw = {k: kw.pop(k) for k in ("jobs", "preemptions", "arrival", "hold")}
    for seed in seeds:
        trace = make_trace(seed, **trace_kw)
        off = run(trace, signal=False, **kw).summary()
        on = run(trace, signal=True, **kw).summary()
        out.append((seed, off, on))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--preemptions", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5, help="seeds seed .. seed + rounds - 1")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--arrival", type=float, default=60.0, help="mean seconds between arrivals")
    ap.add_argument(
        "--hold", type=float, default=1800.0, help="mean seconds a high job runs (inf: forever)"
    )
    ap.add_argument("--poll", type=float, default=30.0, help="seconds between status polls")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from benchstats import spread

    results = rounds(
        range(args.seed, args.seed + args.rounds),
        jobs=args.jobs,
        preemptions=args.preemptions,
        arrival=args.arrival,
        hold=args.hold,
        poll=args.poll,
    )
    if args.json:
        print(json.dumps([{"seed": s, "off": off, "on": on} for s, off, on in results], indent=2))
        return
    print(
        f"simulation: {args.jobs} low jobs, {args.preemptions} preemptions per round, "
        f"arrivals every {args.arrival:g} s, holds {args.hold:g} s (means), poll {args.poll:g} s"
    )
    print(f"{'seed':>4} {'':>4} {'mean s':>9} {'median s':>9} {'total h':>9}")
    for seed, off, on in results:
        for label, r in (("off", off), ("on", on)):
            print(
                f"{seed:>4} {label:>4} {r['mean_s']:9.1f} {r['median_s']:9.1f}"
                f" {r['total_s'] / 3600:9.2f}"
            )
        print(f"{'':>4} {'on/off':>4} total {on['total_s'] / off['total_s']:.3f}")
    ratios = [on["total_s"] / off["total_s"] for _, off, on in results]
    print(f"lost work on/off (total per round), median [min-max] over rounds: {spread(ratios)}")
    for key in ("mean_s", "median_s"):
        print(
            f"{key}: off {spread([o[key] for _, o, _ in results], 1)}"
            f"  on {spread([n[key] for _, _, n in results], 1)}"
        )


if __name__ == "__main__":
    main()
