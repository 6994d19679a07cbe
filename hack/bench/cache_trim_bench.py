"""The progress controller's memory at many large pending pods, with and without cache trimming
(issue 24, item 6; progress_controller/trim.py).

Usage: python hack/bench/cache_trim_bench.py [--pods 3000] [--env 100] [--annotations 20]
           [--runs 2]
(starts its own local control plane for the run; about 5 minutes at the defaults)

The pods are training pods as an operator makes them (a PyTorchJob's labels; two of three marked
injected, the rest not, so both of the controller's pod caches hold some), each with `--env`
literal env variables of 200 bytes beside the contract's two, `--annotations` annotations of 500
bytes, and managedFields from two managers (created by one, server-side applied by another:
managedFields list every env entry). They stay Pending (a nodeSelector no node has), as pods of a
job waiting for capacity do. No job objects exist, so the controller caches the pods and
otherwise idles.

The controller (this checkout's `python -m progress_controller.main`) runs as its own process
against that cluster, in turn with `--no-cache-trim` (whole objects) and with the default trim,
`--runs` times each, alternating which goes first; each run ends when /readyz answers (every
informer synced) plus a settling period. Reported per mode (median over the runs): the process's
RSS (VmRSS) and peak RSS (VmHWM) once synced, the time to /readyz, and the RSS above the same
process's with no pods (measured first, in the same run) per pod. Also the mean size of one pod as
the API sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "hack")]

from localcluster import LocalCluster  # noqa: E402
from reconciler import Client  # noqa: E402
from reconciler.config import load_kubeconfig  # noqa: E402
from reconciler.resources import PODS  # noqa: E402

NS = "trim-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod(i: int, env: int, annotations: int) -> dict[str, Any]:
    job = f"job-{i // 2:05d}"
    labels = {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": "master" if i % 2 == 0 else "worker",
        "training.kubeflow.org/replica-index": "0",
    }
    if i % 3 != 2:
        labels["kubeckpt.io/injected"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{i % 2}",
            "namespace": NS,
            "labels": labels,
            "annotations": {
                f"tooling.example.com/note-{k}": f"{k:03d}" + "a" * 497 for k in range(annotations)
            },
        },
        "spec": {
            "nodeSelector": {"kubeckpt.io/bench": "nowhere"},  # stays Pending
            "containers": [
                {
                    "name": "pytorch",
                    "image": "trainer:1",
                    "env": [
                        {"name": "TRAINING_PROGRESS_FILE", "value": "/var/run/kubeckpt/p.json"},
                        {"name": "PROGRESS_UPDATE_FREQUENCY", "value": "5"},
                        *(
                            {"name": f"SETTING_{k:03d}", "value": f"{k:03d}" + "v" * 197}
                            for k in range(env)
                        ),
                    ],
                }
            ],
        },
    }


async def create_pods(client: Client, n: int, env: int, annotations: int) -> float:
    """Create the pods (manager `bench-create`), then server-side apply a label to each (manager
    `bench-apply`): two managedFields entries. Returns the mean JSON size of a pod as read."""
    api = client.api(PODS)
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        body = pod(i, env, annotations)
        async with sem:
            await api.create(body, NS)
            await api.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": body["metadata"]["name"],
                        "namespace": NS,
                        "labels": {"bench.example.com/applied": "yes"},
                    },
                },
                field_manager="bench-apply",
            )

    await asyncio.gather(*(one(i) for i in range(n)))
    sample = await api.list(NS, limit=50)
    sizes = [len(json.dumps(p, separators=(",", ":"))) for p in sample["items"]]
    return statistics.mean(sizes)


def proc_mem(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out["VmRSS"], out["VmHWM"]


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def run_controller(cluster: LocalCluster, trim: bool, settle: float, log: Path) -> dict:
    port, metrics = free_port(), free_port()
    # This checkout's controller (`python -m`), not whichever one the venv's script points at.
    cmd = [
        sys.executable,
        "-m",
        "progress_controller.main",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--no-leader-elect",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics),
        "--no-metrics-secure",
        "--log-level",
        "WARNING",
        "--cache-trim" if trim else "--no-cache-trim",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "hack")])}
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        t0 = time.monotonic()
        while not ready(port):
            if proc.poll() is not None:
                raise SystemExit(f"kubeckpt-reconciler exited with {proc.returncode}: see {log}")
            if time.monotonic() - t0 > 600:
                raise SystemExit("the controller did not become ready in 600 s")
            time.sleep(0.2)
        synced = time.monotonic() - t0
        time.sleep(settle)  # handlers and the first reconciles run; RSS settles
        rss, hwm = proc_mem(proc.pid)
        return {"ready_s": synced, "rss": rss, "hwm": hwm}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--env", type=int, default=100, help="extra env variables per pod (200 B)")
    ap.add_argument("--annotations", type=int, default=20, help="annotations per pod (500 B)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each mode, alternating")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after /readyz")
    args = ap.parse_args()

    cluster = LocalCluster(nodes=1)
    cluster.start()
    try:
        assert cluster.workdir is not None
        log = cluster.workdir / "reconciler.log"
        cluster.kubectl("create", "namespace", NS)
        empty = run_controller(cluster, True, args.settle, log)
        print(f"no pods: RSS {mib(empty['rss'])}, peak {mib(empty['hwm'])}", flush=True)
        cfg = load_kubeconfig(cluster.kubeconfig)
        cfg.qps = None
        async with Client(cfg) as client:
            t0 = time.monotonic()
            size = await create_pods(client, args.pods, args.env, args.annotations)
        print(
            f"setup: {args.pods} pods of {size / 1024:.1f} KiB each (as the API sends them) "
            f"in {time.monotonic() - t0:.0f}s",
            flush=True,
        )
        results: dict[bool, list[dict]] = {False: [], True: []}
        for r in range(args.runs):
            for trim in (False, True) if r % 2 == 0 else (True, False):
                res = run_controller(cluster, trim, args.settle, log)
                results[trim].append(res)
                print(
                    f"run {r + 1} {'trimmed' if trim else 'whole  '}: ready {res['ready_s']:.1f}s,"
                    f" RSS {mib(res['rss'])}, peak {mib(res['hwm'])}",
                    flush=True,
                )
        print()
        print(f"| {args.pods} pending pods, {size / 1024:.1f} KiB each | whole objects | trimmed |")
        print("| --- | --- | --- |")

        def med(trim: bool, key: str) -> float:
            return statistics.median(x[key] for x in results[trim])

        print(f"| RSS once synced | {mib(med(False, 'rss'))} | {mib(med(True, 'rss'))} |")
        print(f"| peak RSS (VmHWM) | {mib(med(False, 'hwm'))} | {mib(med(True, 'hwm'))} |")
        per_pod = [(med(t, "rss") - empty["rss"]) / args.pods / 1024 for t in (False, True)]
        print(f"| RSS above no pods, per pod | {per_pod[0]:.1f} KiB | {per_pod[1]:.1f} KiB |")
        print(f"| time to /readyz | {med(False, 'ready_s'):.1f} s | {med(True, 'ready_s'):.1f} s |")
        print(f"\nno pods: RSS {mib(empty['rss'])}; runs per mode: {args.runs}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
