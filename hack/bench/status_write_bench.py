"""What one TrainingProgress status write costs the API server, by how it is sent (issue 26: push
freshness at 5,000 jobs is bound by status writes, 161 a second on two cores, and more workers
wrote fewer).

Usage: python hack/bench/status_write_bench.py [--objects 2000] [--seconds 30] [--workers 16]
           [--rounds 2] [--methods apply,merge]

One control plane (LocalCluster, no nodes); `--objects` TrainingProgresses in one namespace, each
with the status the controller's own `decide` makes from a pushed record. Then, in rounds that
alternate the methods' order (A B, B A, ...), `--workers` writers each take the next object in
turn and write its status for the next step (again `decide`'s, from the stored status, exactly
what a reconcile that takes a push writes) for `--seconds`:

- `apply`: what the controller sends today, server-side apply of the whole status on /status
  with its field manager, forced (reconciler.apply.apply_status);
- `merge`: a JSON merge patch (RFC 7386) on /status of only what changed against the stored
  status (removed keys as null), with the same field manager.

Reported per method: writes per second, latency p50/p95, and the CPU seconds the kube-apiserver
and etcd processes spent per 1,000 writes (/proc/<pid>/stat, the whole process: nothing else
writes meanwhile), with the ratio merge / apply. The bench's own client has no QPS limit.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "hack")]

from bench import progress_bench as pb  # noqa: E402

from kubeckpt_api.groupversion import TRAINING_PROGRESS  # noqa: E402
from localcluster import LocalCluster  # noqa: E402
from progress_controller.controller import FIELD_MANAGER, TRAININGPROGRESSES  # noqa: E402
from progress_controller.decide import Observation, decide  # noqa: E402
from progress_controller.reading import parse  # noqa: E402
from reconciler.apply import apply_status, status_patch  # noqa: E402
from reconciler.client import Client  # noqa: E402
from reconciler.config import load_kubeconfig  # noqa: E402

NS = "status-bench"
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def merge_diff(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `old` into `new`: changed keys with their new value,
    removed keys as null, objects recursed into, anything else (lists too) replaced whole."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    out: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = merge_diff(old[k], v)
    return out


def rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def record(step: int, now: datetime) -> bytes:
    """A progress record as the HF runtime pushes it: a checkpoint every 50 steps."""
    latest = step - step % 50
    body: dict[str, Any] = {
        "epoch": step // 1000,
        "step": step,
        "totalSteps": 100_000,
        "loss": f"{2.0 - step * 1e-5:.6f}",
        "learningRate": "0.0003",
        "percentComplete": f"{step / 1000:.2f}",
        "estimatedTimeRemaining": "27h",
        "stepSeconds": "1.0",
        "lastUpdateTime": rfc3339(now),
        "incarnation": "0123456789abcdef0123456789abcdef",
        "checkpointing": {
            "enabled": True,
            "latestCheckpoint": f"/ckpt/checkpoint-{latest}",
            "latestCheckpointTime": rfc3339(now - timedelta(seconds=step % 50)),
            "checkpointsCreated": latest // 50,
            "latestCheckpointReason": "periodic",
        },
    }
    return json.dumps(body).encode()


def next_status(prev: dict[str, Any], step: int) -> dict[str, Any]:
    now = T0 + timedelta(seconds=step)
    obs = Observation(pod="job-master-0", source="push", record=parse(record(step, now)))
    obs.stall_after = 60.0
    obs.job_created = T0 - timedelta(hours=1)
    return decide(prev, obs, now).status


def take_profile(cluster: LocalCluster, out: Path, seconds: float) -> None:
    """A CPU profile of the kube-apiserver over `seconds`, through its /debug/pprof."""
    raw = f"/debug/pprof/profile?seconds={max(1, int(seconds))}"
    kubectl = str(cluster.binaries.kubectl)  # type: ignore[union-attr]
    with out.open("wb") as f:
        subprocess.run(
            [kubectl, "--kubeconfig", str(cluster.kubeconfig), "get", "--raw", raw],
            stdout=f,
            check=True,
            timeout=seconds + 60,
        )


async def create_all(client: Client, n: int) -> list[dict[str, Any]]:
    api = client.api(TRAININGPROGRESSES)
    statuses: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        name = f"job-{i:05d}"
        ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name}
        body = {
            "apiVersion": TRAINING_PROGRESS.api_version,
            "kind": TRAINING_PROGRESS.kind,
            "metadata": {"name": name, "namespace": NS},
            "spec": {"jobRef": ref},
        }
        async with sem:
            await api.create(body)
            status = next_status({}, 1)
            await apply_status(
                api,
                status_patch(
                    TRAINING_PROGRESS.api_version, TRAINING_PROGRESS.kind, name, NS, status
                ),
                field_manager=FIELD_MANAGER,
                force=True,
            )
        statuses[i] = status

    statuses.extend({} for _ in range(n))
    await asyncio.gather(*(one(i) for i in range(n)))
    return statuses


async def run_round(
    client: Client,
    method: str,
    statuses: list[dict[str, Any]],
    seconds: float,
    workers: int,
    pids: dict[str, int],
) -> dict[str, Any]:
    api = client.api(TRAININGPROGRESSES)
    latencies: list[float] = []
    cursor = [0]
    deadline = time.monotonic() + seconds
    cpu0 = {k: pb.proc_stats(p)[0] for k, p in pids.items()}

    async def worker() -> None:
        while time.monotonic() < deadline:
            i = cursor[0] % len(statuses)
            cursor[0] += 1
            name = f"job-{i:05d}"
            prev = statuses[i]
            new = next_status(prev, prev["step"] + 1)
            t = time.monotonic()
            if method == "apply":
                body = status_patch(
                    TRAINING_PROGRESS.api_version, TRAINING_PROGRESS.kind, name, NS, new
                )
                await apply_status(api, body, field_manager=FIELD_MANAGER, force=True)
            else:
                patch = {"status": merge_diff(prev, new)}
                await api.patch(
                    name,
                    patch,
                    NS,
                    patch_type="merge",
                    subresource="status",
                    field_manager=FIELD_MANAGER,
                )
            latencies.append(time.monotonic() - t)
            statuses[i] = copy.deepcopy(new)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    wall = time.monotonic() - t0
    cpu = {k: pb.proc_stats(p)[0] - cpu0[k] for k, p in pids.items()}
    latencies.sort()
    n = len(latencies)
    return {
        "method": method,
        "writes": n,
        "per_s": n / wall,
        "p50": statistics.median(latencies),
        "p95": latencies[int(0.95 * (n - 1))],
        "cpu_per_1000": {k: 1000 * v / n for k, v in cpu.items()},
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", default="apply,merge")
    ap.add_argument(
        "--pprof",
        type=Path,
        help="also take a CPU profile of the kube-apiserver during each method's first round, "
        "into this directory (`go tool pprof -top FILE` reads it)",
    )
    args = ap.parse_args()
    methods = args.methods.split(",")

    cluster = LocalCluster(nodes=0)
    cluster.start()
    try:
        if args.pprof:
            # The local cluster runs it with profiling off: on for this run, one restart.
            argv = cluster.apiserver_argv
            cluster.apiserver_argv = lambda: [  # type: ignore[method-assign]
                "--profiling=true" if a == "--profiling=false" else a for a in argv()
            ]
            cluster.restart_apiserver()
            args.pprof.mkdir(parents=True, exist_ok=True)
        cluster.kubectl("create", "namespace", NS)
        pids = {k: cluster.procs[k].popen.pid for k in ("kube-apiserver", "etcd")}
        cfg = load_kubeconfig(cluster.kubeconfig)
        cfg.qps = None
        async with Client(cfg) as client:
            t = time.monotonic()
            statuses = await create_all(client, args.objects)
            size = len(json.dumps(statuses[0]))
            print(
                f"{args.objects} TrainingProgresses, status {size} bytes as JSON, "
                f"made in {time.monotonic() - t:.0f} s",
                flush=True,
            )
            # One sample of each method's body, to show what goes on the wire.
            sample = next_status(statuses[0], statuses[0]["step"] + 1)
            print(
                f"apply body {len(json.dumps({'status': sample}))} bytes, merge body "
                f"{len(json.dumps({'status': merge_diff(statuses[0], sample)}))} bytes"
            )
            results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            for r in range(args.rounds):
                order = methods if r % 2 == 0 else methods[::-1]
                for m in order:
                    profile = None
                    if args.pprof and r == 0:
                        profile = asyncio.create_task(
                            asyncio.to_thread(
                                take_profile, cluster, args.pprof / f"{m}.pb.gz", args.seconds - 5
                            )
                        )
                    res = await run_round(client, m, statuses, args.seconds, args.workers, pids)
                    if profile is not None:
                        await profile
                    results[m].append(res)
                    cpu = ", ".join(f"{k} {v:.2f} s" for k, v in res["cpu_per_1000"].items())
                    print(
                        f"round {r + 1} {m:5s}: {res['per_s']:7.1f} writes/s, p50 "
                        f"{1000 * res['p50']:.1f} ms, p95 {1000 * res['p95']:.1f} ms; "
                        f"CPU per 1,000 writes: {cpu}",
                        flush=True,
                    )
        print("\nmedian over rounds:")
        med = {
            m: {
                "per_s": statistics.median(x["per_s"] for x in rs),
                "p95": statistics.median(x["p95"] for x in rs),
                "apiserver": statistics.median(x["cpu_per_1000"]["kube-apiserver"] for x in rs),
                "etcd": statistics.median(x["cpu_per_1000"]["etcd"] for x in rs),
            }
            for m, rs in results.items()
        }
        for m, v in med.items():
            print(
                f"  {m:5s}: {v['per_s']:.1f} writes/s, p95 {1000 * v['p95']:.1f} ms, CPU per "
                f"1,000 writes: kube-apiserver {v['apiserver']:.2f} s, etcd {v['etcd']:.2f} s"
            )
        if "apply" in med and "merge" in med:
            a, b = med["apply"], med["merge"]
            print(
                f"  merge / apply: writes/s {b['per_s'] / a['per_s']:.2f}x, CPU per write: "
                f"kube-apiserver {b['apiserver'] / a['apiserver']:.2f}x, "
                f"etcd {b['etcd'] / a['etcd']:.2f}x"
            )
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
