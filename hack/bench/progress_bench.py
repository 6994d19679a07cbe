"""Progress controller at scale (issue 7): N PyTorchJobs of 2 pods each on KWOK, each master's
progress file rewritten every `--update` seconds; kubeckpt-reconciler runs as its own process.

Usage: python hack/bench/progress_bench.py [--jobs 1000] [--update 10] [--measure SECONDS]
           [-- extra kubeckpt-reconciler flags, e.g. --exec-qps 100]
(starts its own local control plane for the run; --update 30 or 60 for slower jobs: the records
say stepSeconds = update / PROGRESS_UPDATE_FREQUENCY, so the controller knows the file's period
and never polls faster; --measure defaults to max(150, 6 x update) s; --random-phase: each job's
rewrite at its own random offset in the period instead of in job order)

The jobs are suspended (`runPolicy.suspend`), so the training-operator makes no pods; the bench
creates each job's master and worker pods itself (labelled as the operator labels them, marked as
injected, bound to a KWOK node) and one KWOK Exec per master serving a directory on this host.

Reported: freshness lag (file rewritten -> TrainingProgress status shows that step, seen by a
watch) p50/p95/max; the controller's API requests per second by verb (its own /metrics, over the
measurement window); the polling interval set (the schedule's, from the controller's defaults
and the file's period) and the one in force (measured: seconds between execs of a job); lag over
the interval in force; execs and status writes per job per interval and per file rewrite; status
writes that changed nothing but lastPollTime, seen by the watch (must be 0); CPU seconds and peak
RSS (VmHWM) of the controller process; reads that wrote nothing because nothing changed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "hack")]

from kubeckpt_api.groupversion import TRAINING_PROGRESS  # noqa: E402
from localcluster import LocalCluster  # noqa: E402
from progress_controller.decide import changed  # noqa: E402
from progress_controller.schedule import PollSettings  # noqa: E402
from reconciler import Client, Informer  # noqa: E402
from reconciler.config import load_kubeconfig  # noqa: E402
from reconciler.resources import PODS, Resource, ResourceClient  # noqa: E402
from trainer_runtime.contract.progress import parse_rfc3339  # noqa: E402

NS = "bench"
EXECS = Resource("kwok.x-k8s.io", "v1alpha1", "execs", "Exec")
JOBS = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
TPS = TRAINING_PROGRESS.resource
FREQUENCY = 5  # PROGRESS_UPDATE_FREQUENCY in the pods: the file is written every 5 steps


def record(step: int, update: float = 10.0) -> bytes:
    return json.dumps(
        {
            "step": step,
            "totalSteps": 100000,
            "loss": f"{1 / (step + 1):.4f}",
            "percentComplete": f"{step / 1000:.1f}",
            "estimatedTimeRemaining": "10h",
            "stepSeconds": f"{update / FREQUENCY:g}",
            "lastUpdateTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "checkpointing": {
                "enabled": True,
                "latestCheckpoint": f"/ckpt/checkpoint-{step // 50 * 50}",
            },
        }
    ).encode()


def write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


async def gather_bounded(n: int, coros) -> None:
    sem = asyncio.Semaphore(n)

    async def one(c):
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


async def setup(client: Client, root: Path, jobs: int, update: float) -> list[Path]:
    paths = []
    job_api, pod_api, exec_api = client.api(JOBS), client.api(PODS), client.api(EXECS)
    template = {"spec": {"containers": [{"name": "pytorch", "image": "x"}]}}
    coros = []
    for i in range(jobs):
        name = f"job-{i:04d}"
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        path = d / "progress.json"
        write(path, record(1, update))
        paths.append(path)
        job = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "runPolicy": {"suspend": True},
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
                    "Worker": {"replicas": 1, "restartPolicy": "OnFailure", "template": template},
                },
            },
        }
        coros.append(create_job(job_api, pod_api, exec_api, job, d, path, i))
    await gather_bounded(32, coros)
    return paths


async def create_job(
    job_api: ResourceClient,
    pod_api: ResourceClient,
    exec_api: ResourceClient,
    job: dict,
    d: Path,
    path: Path,
    i: int,
) -> None:
    """The job, then its KWOK Exec and its two pods, each pod controlled by the job (the
    controller's ownership check follows the controller reference to the job's uid)."""
    name = job["metadata"]["name"]
    created = await job_api.create(job)
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": name,
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    coros = []
    coros.append(
        exec_api.create(
            {
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "Exec",
                "metadata": {"name": f"{name}-m", "namespace": NS},
                "spec": {"execs": [{"local": {"workDir": str(d)}}]},
            }
        )
    )
    for role, suffix in (("master", "m"), ("worker", "w")):
        labels = {
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/replica-type": role,
            "training.kubeflow.org/replica-index": "0",
            "kubeckpt.io/injected": "true",
        }
        if role == "master":
            labels["training.kubeflow.org/job-role"] = "master"
        coros.append(
            pod_api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{suffix}",
                        "namespace": NS,
                        "labels": labels,
                        "ownerReferences": [owner],
                    },
                    "spec": {
                        "nodeName": f"kwok-node-{i % 3}",
                        "containers": [
                            {
                                "name": "pytorch",
                                "image": "x",
                                "env": [
                                    {"name": "TRAINING_PROGRESS_FILE", "value": str(path)},
                                    {
                                        "name": "PROGRESS_UPDATE_FREQUENCY",
                                        "value": str(FREQUENCY),
                                    },
                                ],
                            }
                        ],
                    },
                }
            )
        )
    await asyncio.gather(*coros)


def proc_stats(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return cpu, hwm


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r"^kubeckpt_progress_(\w+)_total ([0-9.e+]+)$", text, re.M):
        out[f"progress_{m.group(1)}"] = float(m.group(2))
    for m in re.finditer(r"^rest_client_requests_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        verb = labels.get("method", labels.get("verb", "?"))
        out[verb] = out.get(verb, 0.0) + float(m.group(2))
    return out


def prepare(cluster: LocalCluster) -> None:
    """The bench's namespace, and an address on each KWOK node (KWOK's exec needs one)."""
    cluster.kubectl("create", "namespace", NS)
    for i in range(3):
        cluster.kubectl(
            "patch",
            "node",
            f"kwok-node-{i}",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(
                {
                    "status": {
                        "addresses": [
                            {"type": "InternalIP", "address": "127.0.0.1"},
                            {"type": "Hostname", "address": f"kwok-node-{i}"},
                        ]
                    }
                }
            ),
        )


def spawn_reconciler(
    cluster: LocalCluster, metrics_port: int, extra: list[str]
) -> subprocess.Popen[bytes]:
    """kubeckpt-reconciler as its own process, its /metrics on plain HTTP (the bench reads its
    own counters), its log in the cluster's workdir."""
    script = Path(sys.executable).parent / "kubeckpt-reconciler"
    log = open(cluster.workdir / "reconciler.log", "wb")  # type: ignore[operator]
    return subprocess.Popen(
        [
            str(script),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--no-leader-elect",
            "--port",
            "0",
            "--metrics-port",
            str(metrics_port),
            "--no-metrics-secure",
            "--log-level",
            "WARNING",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop_reconciler(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--update", type=float, default=10.0, help="seconds between file rewrites")
    ap.add_argument("--measure", type=float, default=None, help="default max(150, 6 x update)")
    ap.add_argument(
        "--random-phase",
        action="store_true",
        help="each job's rewrite at a fixed random offset in the period (default: job order)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--warmup-timeout", type=float, default=600.0)
    ap.add_argument("extra", nargs="*", help="extra kubeckpt-reconciler flags (after --)")
    args = ap.parse_args()
    if args.measure is None:
        args.measure = max(150.0, 6 * args.update)

    cluster = LocalCluster(nodes=3)
    cluster.start()
    proc = None
    try:
        prepare(cluster)
        cfg = load_kubeconfig(cluster.kubeconfig)
        cfg.qps = None
        root = cluster.workdir / "bench-exec"  # type: ignore[operator]
        async with Client(cfg) as client:
            t0 = time.monotonic()
            paths = await setup(client, root, args.jobs, args.update)
            print(
                f"setup: {args.jobs} jobs, {2 * args.jobs} pods in {time.monotonic() - t0:.0f}s",
                flush=True,
            )
            port = 18081 + random.randrange(1000)
            proc = spawn_reconciler(cluster, port, args.extra)
            started = time.monotonic()
            tps = Informer(client.api(TPS), namespace=NS)
            written: dict[str, tuple[int, float]] = {}
            lags: list[float] = []
            tp_writes = [0]
            unchanged_writes = [0]
            per_job: dict[str, int] = {}
            polls: dict[str, list[float]] = {}  # lastPollTime of each status write, per job

            def on_tp(_old, new=None) -> None:
                # Lag: from the first rewrite the status did not show yet to the status showing
                # a newer step (what a reader of `kubectl get tp` waits for).
                obj = new if new is not None else _old
                name = obj["metadata"]["name"]
                if new is not None:
                    old_st, new_st = _old.get("status") or {}, new.get("status") or {}
                    if old_st == new_st:
                        return  # not a status write (metadata only, or a relist)
                    if not changed(old_st, new_st):
                        unchanged_writes[0] += 1  # only lastPollTime moved
                tp_writes[0] += 1
                per_job[name] = per_job.get(name, 0) + 1
                if (polled := (obj.get("status") or {}).get("lastPollTime")) is not None:
                    polls.setdefault(name, []).append(parse_rfc3339(polled).timestamp())
                step = (obj.get("status") or {}).get("step")
                w = written.get(name)
                if w is not None and step is not None and step >= w[0]:
                    lags.append(time.monotonic() - w[1])
                    written.pop(name, None)

            from reconciler.informer import EventHandler

            tps.add_handler(EventHandler(on_add=on_tp, on_update=on_tp))
            tp_task = asyncio.create_task(tps.run())
            t0 = time.monotonic()
            while sum(1 for t in tps.store if (t.get("status") or {}).get("step") == 1) < args.jobs:
                if time.monotonic() - t0 > args.warmup_timeout:
                    raise SystemExit("warm-up timed out")
                await asyncio.sleep(1)
            print(
                f"warm-up: every TrainingProgress at step 1 after {time.monotonic() - t0:.0f}s",
                flush=True,
            )
            before = scrape(port)
            cpu0, _ = proc_stats(proc.pid)
            lags.clear()
            tp_writes[0] = unchanged_writes[0] = 0
            per_job.clear()
            polls.clear()
            start = time.monotonic()
            step = 1
            # Rewrite every file once per period, spread over it: in job order (the order the
            # controller first read them in, so rewrites tend to land just before a poll), or
            # with --random-phase at a fixed random offset per job (the phase between rewrite
            # and poll is then uniform: lag p50 about half the interval, p95 about all of it).
            if args.random_phase:
                rng = random.Random(args.seed)
                offsets = [rng.random() for _ in paths]
            else:
                offsets = [i / len(paths) for i in range(len(paths))]
            order = sorted(range(len(paths)), key=offsets.__getitem__)
            while time.monotonic() - start < args.measure:
                step += 1
                period_start = time.monotonic()
                for i in order:
                    path = paths[i]
                    target = period_start + args.update * offsets[i]
                    if (delay := target - time.monotonic()) > 0:
                        await asyncio.sleep(delay)
                    write(path, record(step, args.update))
                    # keep the first write the status has not shown yet
                    written.setdefault(path.parent.name, (step, time.monotonic()))
                if (delay := period_start + args.update - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
            elapsed = time.monotonic() - start
            jobs_age = time.monotonic() - started  # the controller first saw the jobs at start
            after = scrape(port)
            cpu1, hwm = proc_stats(proc.pid)
            await asyncio.sleep(0)
            tp_task.cancel()
        lags.sort()
        rates = {v: round((after.get(v, 0) - before.get(v, 0)) / elapsed, 2) for v in after}
        reads = after.get("progress_reads", 0) - before.get("progress_reads", 0)
        writes = after.get("progress_writes", 0) - before.get("progress_writes", 0)
        # The schedule's interval for these jobs: young (early) or recently changed (recent),
        # never under the file's period; jitter adds half its bound on average.
        ps = PollSettings()
        base = ps.early if jobs_age < ps.early_window else ps.recent
        interval_set = max(base, args.update) * (1 + ps.jitter / 2)
        # The interval in force: seconds between a job's polls, from the lastPollTime of its
        # consecutive status writes (1 s resolution; a poll that found no change and wrote
        # nothing makes one gap twice as long, hence the median). Counting reads over the window
        # instead is biased when the window holds few intervals: the polls of all jobs start
        # together at warm-up.
        gaps = [b - a for ts in polls.values() for a, b in itertools.pairwise(ts) if b > a]
        in_force = statistics.median(gaps) if gaps else None
        rewrites = elapsed / args.update
        result = {
            "jobs": args.jobs,
            "update_seconds": args.update,
            "measure_seconds": round(elapsed),
            "flags": args.extra,
            "phase": "random" if args.random_phase else "job order",
            "interval_set_mean_s": round(interval_set, 2),
            "interval_in_force_s": round(in_force, 2) if in_force else None,
            "interval_in_force_mean_s": round(statistics.fmean(gaps), 2) if gaps else None,
            "interval_by_read_count_s": round(elapsed * args.jobs / reads, 2) if reads else None,
            "lag_samples": len(lags),
            "lag_p50_s": round(statistics.median(lags), 2) if lags else None,
            "lag_p95_s": round(lags[int(0.95 * (len(lags) - 1))], 2) if lags else None,
            "lag_max_s": round(lags[-1], 2) if lags else None,
            "lag_p50_over_interval_in_force": (
                round(statistics.median(lags) / in_force, 2) if lags and in_force else None
            ),
            "lag_p95_over_interval_in_force": (
                round(lags[int(0.95 * (len(lags) - 1))] / in_force, 2)
                if lags and in_force
                else None
            ),
            "lag_p95_over_interval_set": (
                round(lags[int(0.95 * (len(lags) - 1))] / interval_set, 2) if lags else None
            ),
            "api_requests_per_s_by_verb": rates,
            "execs_per_job_per_min": round(reads / args.jobs / elapsed * 60, 2),
            "status_writes_per_job_per_min": round(writes / args.jobs / elapsed * 60, 2),
            "execs_per_job_per_interval_set": round(
                reads / args.jobs / (elapsed / interval_set), 2
            ),
            "writes_per_job_per_interval_set": round(
                writes / args.jobs / (elapsed / interval_set), 2
            ),
            "execs_per_job_per_rewrite": round(reads / args.jobs / rewrites, 2),
            "writes_per_job_per_rewrite": round(writes / args.jobs / rewrites, 2),
            "max_tp_writes_of_one_job_per_rewrite": (
                round(max(per_job.values()) / rewrites, 2) if per_job else None
            ),
            "tp_status_updates_seen_per_job_per_min": round(
                tp_writes[0] / args.jobs / elapsed * 60, 2
            ),
            "writes_without_change_seen": unchanged_writes[0],
            "reads_without_change_per_s": round(
                (after.get("progress_skipped_writes", 0) - before.get("progress_skipped_writes", 0))
                / elapsed,
                2,
            ),
            "controller_cpu_s_per_s": round((cpu1 - cpu0) / elapsed, 3),
            "controller_peak_rss_mb": round(hwm / 2**20),
        }
        print(json.dumps(result, indent=2))
    finally:
        stop_reconciler(proc)
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
