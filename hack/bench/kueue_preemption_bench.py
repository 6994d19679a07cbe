"""Lost work per preemption under the REAL Kueue (v0.17, built from its module, KueueStack) with
kubeckpt's cost signal off and on, on the same seeded trace in the same run (issue 25 item 5).

Usage: python hack/bench/kueue_preemption_bench.py [--jobs 12] [--preemptions 6] [--seed 1]
           [--gap 15] [--scale 10] [--warmup 180] [--release] [--min-interval S] [--json FILE]

One local control plane (KWOK nodes, the training-operator, Kueue with the PriorityBoost gate).
Per phase (signal off, then on) a namespace of its own with a ClusterQueue whose CPU quota holds
exactly `--jobs` low-priority PyTorchJobs (one master pod each), preemption within the
ClusterQueue for lower priority, and WorkloadPriorityClasses low (100) and high (10000). The
progress controller runs in-process as in the cluster tests (progress_support.FAST polls, floored
by the controller at the record's update period); in the "on" phase the priority-boost writer
(PreemptionCostController, what `kubeckpt-reconciler --preemption-cost` runs) runs beside it, in
the "off" phase it does not, so no Workload has a boost annotation. The writer's rate limit
(WriteRule.min_interval, 30 s between two rises) is divided by `--scale` like the reported time
(below); its 30 s recheck of a running job is not (a status change reconciles at once anyway).

Each low job's progress record comes through KWOK exec (a directory per master pod, as in the
progress cluster tests) and follows a simulated schedule: one step per wall second, reported as
`--scale` seconds (time compressed: a 10 s step every wall second; the controller polls a record
no faster than its step time, so a larger scale would poll less often), a checkpoint every
`interval_steps` steps (5 to 30 minutes of reported time) at a random phase, a save time. All
jobs are admitted together, so each has lost at most the time since: they train for `--warmup`
seconds (past their first checkpoints) before the first high-priority arrival. The same seed
gives both phases the same schedules and the same gaps between high-priority arrivals.

Each preemption: a high job (one slot) is created, Kueue evicts one low Workload (condition
Evicted, reason Preempted), the bench reads the eviction time from that condition (whole
seconds) and counts the victim's steps since its last checkpoint then (from its schedule) times
the reported step time: the work lost. The high job is deleted, Kueue readmits the victim, which
resumes from that checkpoint (its record says so). Two regimes: by default each high job keeps
its slot, so the evictions are a burst among the jobs still running (`--preemptions` < `--jobs`);
with `--release` each high job is deleted once its victim is evicted and the bench waits for
Kueue to readmit the victim before the next arrival (one eviction at a time, readmissions).

Before each arrival the bench also lists the admitted low Workloads and predicts the victim with
preemption_sim.kueue_victim (Kueue's CandidatesOrdering, as the simulation models it) from their
boost annotations and QuotaReserved times: the agreement is the check that the simulation's
ordering is Kueue's (a boost can change between the listing and Kueue's decision, so a mismatch
there is reported, not hidden).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "hack"), str(REPO / "hack" / "bench")]

from preemption_sim import LOW_PRIORITY, Candidate, kueue_victim  # noqa: E402

from localcluster import LocalCluster  # noqa: E402
from localcluster.kueue import queue_objects  # noqa: E402
from progress_controller.controller import ProgressController  # noqa: E402
from progress_controller.preemption_cost import PRIORITY_BOOST_ANNOTATION  # noqa: E402
from progress_controller.preemption_cost_controller import PreemptionCostController  # noqa: E402
from progress_controller.schedule import PollSettings  # noqa: E402
from progress_controller.workload_boost import (  # noqa: E402
    WORKLOAD_API_VERSION,
    WriteRule,
    workload_job,
)
from reconciler.client import Client  # noqa: E402
from reconciler.config import load_kubeconfig  # noqa: E402
from reconciler.manager import Manager  # noqa: E402
from trainer_runtime.contract.progress import parse_rfc3339  # noqa: E402

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
HIGH_PRIORITY = 10000
CPU_PER_JOB = "10m"
# The progress cluster tests' polls (progress_support.FAST).
FAST = PollSettings(
    early=1.0, recent=1.0, stale=1.0, early_window=0.0, recent_window=5.0, jitter=0.1,
    stall_floor=600.0,
)  # fmt: skip


def queues(ns: str, slots: int) -> list[dict[str, Any]]:
    """Priority classes, a flavor, a ClusterQueue with room for `slots` jobs, its LocalQueue."""
    priorities = {"low": LOW_PRIORITY, "high": HIGH_PRIORITY}
    return queue_objects(ns, cpu=f"{slots * 10}m", memory="100Gi", priorities=priorities)


def job(name: str, ns: str, priority: str, progress_file: str | None) -> dict[str, Any]:
    """A one-pod PyTorchJob in the LocalQueue; a kubeckpt job when it has a progress file."""
    container = {
        "name": "pytorch",
        "image": "busybox",
        "resources": {"requests": {"cpu": CPU_PER_JOB}},
    }
    template: dict[str, Any] = {"spec": {"containers": [container]}}
    if progress_file is not None:
        container["env"] = [
            {"name": "TRAINING_PROGRESS_FILE", "value": progress_file},
            {"name": "PROGRESS_UPDATE_FREQUENCY", "value": "1"},
        ]
        template["metadata"] = {"labels": {"kubeckpt.io/injected": "true"}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {QUEUE_LABEL: "lq", PRIORITY_LABEL: priority},
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}
            }
        },
    }


@dataclass
class Schedule:
    """A low job's simulated training: one step per wall second from `run_start` on."""

    name: str
    interval_steps: int
    offset: int
    save_seconds: float
    path: Path
    run_start: float = 0.0  # wall time (time.time()) it started or resumed
    base_step: int = 0
    running: bool = True

    def step(self, t: float) -> int:
        return self.base_step + max(0, int(t - self.run_start))

    def checkpoint_step(self, t: float) -> int:
        s = self.step(t)
        return max(s - ((s - self.offset) % self.interval_steps), self.base_step)

    def record(self, t: float, scale: float) -> bytes:
        ck = self.checkpoint_step(t)
        ck_time = self.run_start + (ck - self.base_step)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(min(ck_time, t)))
        return json.dumps(
            {
                "step": self.step(t),
                "totalSteps": 10**7,
                "stepSeconds": f"{scale:g}",
                "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)),
                "checkpointing": {
                    "enabled": True,
                    "latestCheckpoint": f"/ckpt/{self.name}/checkpoint-{ck}",
                    "checkpointsCreated": 1,
                    "latestCheckpointTime": stamp,
                    "lastSaveSeconds": f"{self.save_seconds:g}",
                },
            }
        ).encode()


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def trace(seed: int, jobs: int, preemptions: int, gap: float, scale: float) -> dict[str, Any]:
    rng = random.Random(seed)
    specs = []
    for i in range(jobs):
        # A checkpoint every 5 to 30 minutes of reported time.
        steps = max(2, round(rng.uniform(300, 1800) / scale))
        specs.append(
            {"name": f"low-{i:02d}", "interval_steps": steps, "offset": rng.randrange(steps),
             "save_seconds": round(rng.uniform(10, 120), 1)}
        )  # fmt: skip
    gaps = [rng.uniform(0.5 * gap, 1.5 * gap) for _ in range(preemptions)]
    return {"jobs": specs, "gaps": gaps}


def _condition(wl: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def _since(wl: dict[str, Any], type_: str) -> float | None:
    c = _condition(wl, type_)
    if c is None or c.get("status") != "True":
        return None
    return parse_rfc3339(c["lastTransitionTime"]).timestamp()


async def phase(
    cluster: LocalCluster, client: Client, ns: str, plan: dict[str, Any], *, signal: bool,
    scale: float, warmup: float, release: bool, min_interval: float,
) -> dict[str, Any]:  # fmt: skip
    cluster.kubectl("create", "namespace", ns)
    cluster.apply(queues(ns, len(plan["jobs"])))
    scheds: dict[str, Schedule] = {}
    for spec in plan["jobs"]:
        d = cluster.exec_dir(ns, f"{spec['name']}-master-0")
        s = Schedule(path=d / "progress.json", run_start=time.time(), **spec)
        write_atomic(s.path, s.record(time.time(), scale))
        scheds[s.name] = s
    cluster.apply([job(s.name, ns, "low", str(s.path)) for s in scheds.values()])
    workloads = await client.api_for(WORKLOAD_API_VERSION, "Workload")

    async def low_workloads() -> dict[str, dict[str, Any]]:
        out = {}
        for wl in (await workloads.list_all(ns)).items:
            owner = workload_job(wl)
            if owner is not None and owner.name in scheds:
                out[owner.name] = wl
        return out

    async def wait(pred, what: str, within: float = 120.0) -> Any:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if got := await pred():
                return got
            await asyncio.sleep(0.3)
        raise TimeoutError(f"{ns}: {what} within {within:.0f} s")

    stop = asyncio.Event()

    async def keep_records() -> None:  # the "training": each running job's record, every 1 s
        while not stop.is_set():
            now = time.time()
            for s in scheds.values():
                if s.running:
                    write_atomic(s.path, s.record(now, scale))
            await asyncio.sleep(1.0)

    manager = Manager(client, name=f"kueue-bench-{ns}", port=None, drain_timeout=1.0)
    progress = ProgressController(manager, settings=FAST)
    cost = (
        PreemptionCostController(
            manager, progress, rule=WriteRule(min_interval=min_interval), discovery_interval=1.0
        )
        if signal
        else None
    )
    tasks = [asyncio.create_task(manager.run()), asyncio.create_task(keep_records())]
    rows = []
    incident = None
    try:

        async def all_admitted() -> dict[str, dict[str, Any]] | None:
            wls = await low_workloads()
            ok = len(wls) == len(scheds) and all(_since(w, "Admitted") for w in wls.values())
            return wls if ok else None

        await wait(all_admitted, "every low job admitted", within=180)
        for s in scheds.values():
            s.run_start = time.time()  # training starts at admission
        # Every job admitted at once has lost at most the time since: let each run past its
        # first checkpoints (a steady state, each at its own phase) before the first arrival.
        print(f"  {ns}: admitted; {warmup:g} s of training before the first arrival", flush=True)
        await asyncio.sleep(warmup)
        for i, gap in enumerate(plan["gaps"]):
            await asyncio.sleep(gap)
            if release:
                wls = await all_admitted() or await wait(all_admitted, "every low job admitted")
            else:
                wls = {n: w for n, w in (await low_workloads()).items() if scheds[n].running}
            cands = []
            for name, wl in wls.items():
                boost = (wl["metadata"].get("annotations") or {}).get(PRIORITY_BOOST_ANNOTATION)
                cands.append(
                    Candidate(name, wl["metadata"]["uid"], LOW_PRIORITY, int(boost or 0),
                              _since(wl, "QuotaReserved") or 0.0)
                )  # fmt: skip
            predicted = kueue_victim(cands)
            high = f"high-{i:02d}"
            arrived = int(time.time())  # conditions' times are whole seconds
            cluster.apply(job(high, ns, "high", None))

            async def evicted(arrived: int = arrived) -> tuple[str, dict[str, Any]] | None:
                for name, wl in (await low_workloads()).items():
                    c = _condition(wl, "Evicted")
                    # A job evicted before (and not readmitted) is no candidate: Kueue touches
                    # its conditions again while it waits, so its Evicted time can be newer.
                    if (
                        scheds[name].running
                        and c
                        and c.get("status") == "True"
                        and c.get("reason") == "Preempted"
                        and parse_rfc3339(c["lastTransitionTime"]).timestamp() >= arrived
                    ):
                        return name, wl
                return None

            try:
                name, wl = await wait(evicted, f"Kueue to evict a low job for {high}")
            except TimeoutError as e:
                # Reported with the preemptions done so far, not hidden (see docs/benchmarks.md).
                print(f"  {ns} #{i}: stopped: {e}", flush=True)
                incident = str(e)
                break
            s = scheds[name]
            at = parse_rfc3339(_condition(wl, "Evicted")["lastTransitionTime"]).timestamp()
            lost = s.step(at) - s.checkpoint_step(at)
            s.running = False
            s.base_step = s.checkpoint_step(at)
            boosts = {c.name: c.boost for c in cands}
            # Every low Workload Kueue evicted for this arrival (one, unless it took more room)
            # and the victim's Workload as listed before the arrival (None: it was not listed).
            evicted_now = [
                n
                for n, w in (await low_workloads()).items()
                if (c := _condition(w, "Evicted"))
                and c.get("status") == "True"
                and parse_rfc3339(c["lastTransitionTime"]).timestamp() >= arrived
            ]
            rows.append(
                {"victim": name, "predicted": predicted.name, "lost_steps": lost,
                 "lost_seconds": lost * scale, "victim_boost": boosts.get(name),
                 "evicted_for_this_arrival": sorted(evicted_now),
                 "listed": sorted(boosts), "boosts": sorted(boosts.values())}
            )  # fmt: skip
            print(f"  {ns} #{i}: evicted {name} (predicted {predicted.name}), lost {lost} steps "
                  f"= {lost * scale:g} s, boost {boosts.get(name)}, boosts "
                  f"{sorted(boosts.values())}, evicted now {sorted(evicted_now)}, "
                  f"listed {len(boosts)}", flush=True)  # fmt: skip
            if not release:
                continue  # the high job keeps the slot: the next victim is among the rest
            cluster.kubectl("delete", "pytorchjob", high, "-n", ns, "--wait=false")

            async def readmitted(name: str = name, at: float = at) -> bool:
                w = (await low_workloads()).get(name)
                since = _since(w, "Admitted") if w else None
                return since is not None and since >= at

            await wait(readmitted, f"Kueue to readmit {name}")
            write_atomic(s.path, s.record(time.time(), scale))
            s.run_start, s.running = time.time(), True
    finally:
        stop.set()
        manager.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    lost = [r["lost_seconds"] for r in rows] or [float("nan")]
    return {
        "signal": "on" if signal else "off",
        "preemptions": len(rows),
        "mean_s": statistics.fmean(lost),
        "median_s": statistics.median(lost),
        "total_s": sum(lost),
        "predicted_victim_agrees": sum(r["victim"] == r["predicted"] for r in rows),
        "writes": cost.stats["writes"] if cost else 0,
        "stopped": incident,
        "rows": rows,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--preemptions", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gap", type=float, default=15.0, help="mean wall seconds between arrivals")
    ap.add_argument("--scale", type=float, default=10.0, help="reported seconds per wall step")
    ap.add_argument(
        "--warmup", type=float, default=180.0, help="wall seconds of training before the trace"
    )
    ap.add_argument(
        "--release",
        action="store_true",
        help="delete each high job once it has evicted its victim (which Kueue readmits); "
        "default: high jobs keep their slots, each eviction is among the jobs still running",
    )
    ap.add_argument(
        "--min-interval",
        type=float,
        default=None,
        help="the writer's WriteRule.min_interval in wall seconds (default: its 30 s / --scale)",
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.min_interval is None:
        args.min_interval = WriteRule().min_interval / args.scale
    if not args.release and args.preemptions >= args.jobs:
        ap.error("without --release every preemption takes a slot for good: --preemptions < --jobs")
    plan = trace(args.seed, args.jobs, args.preemptions, args.gap, args.scale)
    cluster = LocalCluster(nodes=3)
    cluster.start()
    try:
        cluster.start_kueue()
        cfg = load_kubeconfig(cluster.kubeconfig)
        cfg.qps = None
        results = []
        async with Client(cfg) as client:
            for signal in (False, True):
                t0 = time.monotonic()
                r = await phase(
                    cluster, client, f"sig-{'on' if signal else 'off'}", plan,
                    signal=signal, scale=args.scale, warmup=args.warmup,
                    release=args.release, min_interval=args.min_interval,
                )  # fmt: skip
                r["wall_s"] = round(time.monotonic() - t0)
                results.append(r)
        off, on = results
        for r in results:
            print(
                f"signal {r['signal']:>3}: {r['preemptions']} preemptions, lost work per "
                f"preemption mean {r['mean_s']:.0f} s, median {r['median_s']:.0f} s, total "
                f"{r['total_s']:.0f} s; Kueue's victim = the predicted one "
                f"{r['predicted_victim_agrees']}/{r['preemptions']}; boost writes {r['writes']}; "
                f"{r['wall_s']} s"
            )
        # Over the arrivals both phases got through (a phase can stop early: "stopped").
        n = min(off["preemptions"], on["preemptions"])
        both = [sum(r["lost_seconds"] for r in p["rows"][:n]) for p in (off, on)]
        ratio = both[1] / both[0] if both[0] else float("nan")
        print(f"lost work on/off (total over the first {n} arrivals of each): {ratio:.3f}")
        for r in results:
            if r["stopped"]:
                print(f"signal {r['signal']} stopped early: {r['stopped']}")
        if args.json:
            args.json.write_text(json.dumps({"args": vars(args) | {"json": None},
                                             "results": results}, indent=2))  # fmt: skip
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
