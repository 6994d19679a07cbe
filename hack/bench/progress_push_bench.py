"""Progress push at scale (issue 26): N PyTorchJobs on KWOK whose master pods POST their progress
to kubeckpt-reconciler's push endpoint every `--update` seconds.

Usage: python hack/bench/progress_push_bench.py [--jobs 5000] [--update 10] [--measure SECONDS]
           [--generators 2] [-- extra kubeckpt-reconciler flags, e.g. --qps 600]

Set-up is progress_bench's (suspended jobs, two pods each bound to KWOK nodes, a KWOK Exec and a
progress file at step 1 per master: exec pull stays the fallback, as in a cluster; pushes start
once the reconciler has made every job's TrainingProgress). Then, per master pod, a token from
the TokenRequest API bound to that pod with the audience the webhook injects
(`kubeckpt-progress`), so every new token costs the endpoint a real TokenReview. The endpoint
serves a certificate of a CA made for the run; the load generators verify it.

The load generators are processes of their own (asyncio + aiohttp, keep-alive): each pushes its
share of the jobs' records (Trainer's `trainerStatus` shape, what KubeflowCallback sends) once per
period, each job at its own phase in the period, and records when each push was due, sent and
answered. A refused push is not retried: the job's next push follows a period later. The file
keeps step 1, so a status showing a later step can only have come from a push.

The window starts once every job's status shows a pushed step (the token reviews of the warm-up
have their own budget: 20 new tokens/s by default) and lasts `--measure` seconds. Reported:
freshness (push sent -> a watch sees the TrainingProgress status at that step or later) p50/p95/
max; pushes by HTTP code; status writes per job per update (seen by the watch, and the
controller's own count); the controller's API requests per job per minute by verb (its
/metrics); its CPU and peak RSS (/proc); the generators' achieved rate and lateness (an
overloaded generator shows there, not as a slow server).

The peer (unless --no-peer), in the same run after kubeckpt's window and with our reconciler
stopped: Kubeflow Trainer v2.3.0's own status server (TrainJobStatus gate) taking the same pushes
for suspended TrainJobs of the same names, with tokens of its per-TrainJob audience bound to the
same pods. It verifies tokens by OIDC discovery of their issuer, so the cluster is started with
`loopback_issuer=True` (an issuer the host can reach); Trainer runs in a mount namespace with its
token and certificate at the fixed in-pod paths (root, as with the real node).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import multiprocessing as mp
import random
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "hack")]

from bench import progress_bench as pb  # noqa: E402

PUSH_AUDIENCE = "kubeckpt-progress"  # webhook/push_injection.py
TOKEN_SECONDS = 3600  # outlives the run: the bench measures steady state, not token renewal

# --- pure helpers (unit-tested) ---


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]) of `values`; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def phases(n: int, *, random_phase: bool, seed: int = 7) -> list[float]:
    """Each job's push time as a fraction of the period: spread evenly in job order, or at a
    fixed random offset per job."""
    if random_phase:
        rng = random.Random(seed)
        return [rng.random() for _ in range(n)]
    return [i / n for i in range(n)] if n else []


def period_order(
    offsets: list[float], start: float, period: float, k: int
) -> list[tuple[float, int]]:
    """Period `k`'s pushes: (when due, job index) in the order they fall due, each job at
    start + (k + its phase) x period."""
    return sorted((start + (k + ph) * period, i) for i, ph in enumerate(offsets))


def trainer_body(step: int, total: int = 100000) -> bytes:
    """A push in Trainer's `UpdateTrainJobStatusRequest` shape, as KubeflowCallback sends it."""
    return json.dumps(
        {
            "trainerStatus": {
                "progressPercentage": min(100, step * 100 // total),
                "estimatedRemainingSeconds": max(0, total - step),
                "metrics": [
                    {"name": "current_step", "value": str(step)},
                    {"name": "total_steps", "value": str(total)},
                    {"name": "loss", "value": f"{1 / (step + 1):.4f}"},
                ],
                "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        }
    ).encode()


@dataclass(frozen=True)
class Push:
    job: str
    step: int
    due: float
    sent: float
    done: float
    code: int  # HTTP status; 0: no answer (connection error or timeout)


def freshness(pushes: list[Push], seen: dict[str, list[tuple[float, int]]]) -> tuple[list, int]:
    """Per accepted push, seconds from sending it to the first status seen at its step or later
    (`seen[job]`: (time, step) in time order, steps never decreasing); and how many accepted
    pushes no status showed."""
    lags, unseen = [], 0
    for p in pushes:
        if p.code != 200:
            continue
        events = seen.get(p.job) or []
        i = bisect.bisect_left([s for _, s in events], p.step)
        if i == len(events):
            unseen += 1
            continue
        lags.append(max(0.0, events[i][0] - p.sent))
    return lags, unseen


# --- the load generator (a process of its own) ---


def generator_main(
    url_template: str,
    ca_file: str,
    jobs: list[tuple[str, str, float]],
    update: float,
    start: float,
    stop: Any,
    out_file: str,
    connections: int,
) -> None:
    """Push each (job, token, phase) to `url_template` (with {name}) once per `update` from
    `start` (time.monotonic, which is one clock for every process of the host) until `stop` is
    set; write the pushes to `out_file`."""
    pushes = asyncio.run(_generate(url_template, ca_file, jobs, update, start, stop, connections))
    Path(out_file).write_text(json.dumps([list(p.__dict__.values()) for p in pushes]))


async def _generate(
    url_template: str,
    ca_file: str,
    jobs: list[tuple[str, str, float]],
    update: float,
    start: float,
    stop: Any,
    connections: int,
) -> list[Push]:
    import aiohttp

    ctx = ssl.create_default_context(cafile=ca_file)
    conn = aiohttp.TCPConnector(limit=connections, ssl=ctx, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=30)
    pushes: list[Push] = []
    tasks: set[asyncio.Task[None]] = set()
    offsets = [phase for _, _, phase in jobs]
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:

        async def send(name: str, token: str, step: int, due: float) -> None:
            body = trainer_body(step)
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            sent = time.monotonic()
            code = 0
            try:
                async with session.post(
                    url_template.format(name=name), data=body, headers=headers
                ) as resp:
                    await resp.read()
                    code = resp.status
            except (aiohttp.ClientError, TimeoutError):
                code = 0
            pushes.append(Push(name, step, due, sent, time.monotonic(), code))

        k = 0
        while not stop.is_set():
            for due, i in period_order(offsets, start, update, k):
                name, token, _ = jobs[i]
                if (delay := due - time.monotonic()) > 0:
                    await asyncio.sleep(delay)
                if stop.is_set():
                    break
                t = asyncio.create_task(send(name, token, 2 + k, due))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            k += 1
        if tasks:
            await asyncio.wait(tasks, timeout=35)
    return pushes


# --- set-up and measurement (this process) ---


def make_certs(d: Path) -> Path:
    """A CA for the run and the endpoint's certificate for 127.0.0.1/localhost (tls.crt/tls.key
    in `d`, as --progress-push-cert-dir reads); returns the CA's file."""
    from localcluster import pki

    d.mkdir(parents=True, exist_ok=True)
    ca = pki.make_ca("kubeckpt-push-bench-ca")
    ca.write(d, "ca")
    pki.issue(ca, "localhost", dns_names=("localhost",), ips=("127.0.0.1",), server=True).write(
        d, "tls"
    )
    return d / "ca.crt"


async def pod_tokens(
    client: Any, jobs: int, audience: Callable[[str], str] = lambda _job: PUSH_AUDIENCE
) -> dict[str, str]:
    """Per job, a token bound to its master pod (TokenRequest), of `audience(job name)`."""
    from reconciler.resources import PODS

    pods = await client.api(PODS).list_all(
        pb.NS, label_selector="training.kubeflow.org/replica-type=master"
    )
    out: dict[str, str] = {}

    async def one(pod: dict) -> None:
        md, spec = pod["metadata"], pod["spec"]
        sa = spec.get("serviceAccountName") or "default"
        job = md["labels"]["training.kubeflow.org/job-name"]
        review = await client.request(
            "POST",
            f"/api/v1/namespaces/{pb.NS}/serviceaccounts/{sa}/token",
            json_body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [audience(job)],
                    "expirationSeconds": TOKEN_SECONDS,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": md["name"],
                        "uid": md["uid"],
                    },
                },
            },
        )
        out[job] = review["status"]["token"]

    await pb.gather_bounded(32, (one(p) for p in pods.items))
    if len(out) != jobs:
        raise SystemExit(f"tokens for {len(out)} jobs, expected {jobs}")
    return out


def read_pushes(files: list[Path]) -> list[Push]:
    out = []
    for f in files:
        out += [Push(*row) for row in json.loads(f.read_text())]
    return out


def rnd(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def step_of_progress(obj: dict) -> int | None:
    """The step a TrainingProgress's status shows."""
    step = (obj.get("status") or {}).get("step")
    return int(step) if isinstance(step, int) else None


def step_of_trainjob(obj: dict) -> int | None:
    """The step a TrainJob's status.trainerStatus shows (its current_step metric)."""
    ts = (obj.get("status") or {}).get("trainerStatus") or {}
    for m in ts.get("metrics") or []:
        if m.get("name") == "current_step" and str(m.get("value", "")).isdigit():
            return int(m["value"])
    return None


@dataclass
class Phase:
    """One server taking the pushes: where they go, and where its status shows them."""

    label: str
    url_template: str  # with {name}
    ca_file: Path
    tokens: dict[str, str]
    objects: Any  # an Informer on the objects whose status shows the pushed step
    step_of: Callable[[dict], int | None]
    pid: int  # the server's process, for CPU and peak RSS
    metrics_port: int | None  # its /metrics (rest_client_requests_total), if it has one
    warmup_limit: float  # the window starts when every job shows a push, or after this


async def run_phase(ph: Phase, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Push every job's record once per period to `ph`'s server, then measure a window."""
    seen: dict[str, list[tuple[float, int]]] = {}
    writes_seen: Counter[str] = Counter()

    def on_change(old: dict, new: dict | None = None) -> None:
        obj = new if new is not None else old
        st = obj.get("status") or {}
        if new is not None and (old.get("status") or {}) == st:
            return  # not a status write
        name = obj["metadata"]["name"]
        writes_seen[name] += 1
        if (step := ph.step_of(obj)) is not None:
            seen.setdefault(name, []).append((time.monotonic(), step))

    from reconciler.informer import EventHandler

    ph.objects.add_handler(EventHandler(on_add=on_change, on_update=on_change))
    watch = asyncio.create_task(ph.objects.run())
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    gens: list[Any] = []
    try:
        t0 = time.monotonic()
        while len(ph.objects.store) < args.jobs:  # the watch's first list
            if time.monotonic() - t0 > args.warmup_timeout:
                raise SystemExit(f"{ph.label}: the watch saw {len(ph.objects.store)} objects")
            await asyncio.sleep(0.5)
        offsets = phases(args.jobs, random_phase=args.random_phase, seed=args.seed)
        names = sorted(ph.tokens)
        shares: list[list[tuple[str, str, float]]] = [[] for _ in range(args.generators)]
        for i, name in enumerate(names):
            shares[i % args.generators].append((name, ph.tokens[name], offsets[i]))
        start = time.monotonic() + 3.0
        out_files = [work / f"pushes-{ph.label}-{g}.json" for g in range(args.generators)]
        for g in range(args.generators):
            proc = ctx.Process(
                target=generator_main,
                args=(
                    ph.url_template,
                    str(ph.ca_file),
                    shares[g],
                    args.update,
                    start,
                    stop,
                    str(out_files[g]),
                    args.connections,
                ),
                name=f"push-generator-{ph.label}-{g}",
            )
            proc.start()
            gens.append(proc)

        def shown() -> int:
            return sum(1 for o in ph.objects.store if (ph.step_of(o) or 0) >= 2)

        while (n := shown()) < args.jobs and time.monotonic() - start < ph.warmup_limit:
            if any(not g.is_alive() for g in gens):
                raise SystemExit("a load generator died")
            await asyncio.sleep(1)
        print(
            f"{ph.label}: {n} of {args.jobs} jobs show a pushed step "
            f"{time.monotonic() - start:.0f}s after the first push",
            flush=True,
        )
        w0 = time.monotonic()
        before = pb.scrape(ph.metrics_port) if ph.metrics_port else {}
        cpu0, _ = pb.proc_stats(ph.pid)
        writes_before = sum(writes_seen.values())
        await asyncio.sleep(args.measure)
        w1 = time.monotonic()
        after = pb.scrape(ph.metrics_port) if ph.metrics_port else {}
        cpu1, hwm = pb.proc_stats(ph.pid)
        writes_window = sum(writes_seen.values()) - writes_before
        stop.set()
        await asyncio.sleep(2 * args.update)  # the window's last pushes show up
        for g in gens:
            await asyncio.to_thread(g.join, 60)
    finally:
        stop.set()
        for g in gens:
            if g.is_alive():
                g.kill()
        watch.cancel()
    pushes = read_pushes(out_files)
    window = [p for p in pushes if w0 <= p.sent < w1]
    lags, unseen = freshness(window, seen)
    late = [p.sent - p.due for p in window]
    elapsed = w1 - w0
    minutes, updates = elapsed / 60, elapsed / args.update
    verbs = {
        v: round((after.get(v, 0) - before.get(v, 0)) / args.jobs / minutes, 3)
        for v in after
        if not v.startswith("progress_")
    }
    writes = after.get("progress_writes")
    return {
        "server": ph.label,
        "measure_seconds": round(elapsed),
        "shown_at_window_start": n,
        "pushes_due_per_s": round(args.jobs / args.update, 1),
        "pushes_sent_per_s": round(len(window) / elapsed, 1),
        "pushes_accepted_per_s": round(sum(p.code == 200 for p in window) / elapsed, 1),
        "push_lateness_p50_p95_max_s": [
            rnd(percentile(late, 0.5), 3),
            rnd(percentile(late, 0.95), 3),
            rnd(max(late, default=None), 3),
        ],
        "push_answer_p50_p95_s": [
            rnd(percentile([p.done - p.sent for p in window], 0.5), 3),
            rnd(percentile([p.done - p.sent for p in window], 0.95), 3),
        ],
        "pushes_by_code": {str(k): v for k, v in sorted(Counter(p.code for p in window).items())},
        "warmup_pushes_by_code": {
            str(k): v for k, v in sorted(Counter(p.code for p in pushes if p.sent < w0).items())
        },
        "freshness_samples": len(lags),
        "freshness_unseen": unseen,
        "freshness_p50_s": rnd(percentile(lags, 0.5)),
        "freshness_p95_s": rnd(percentile(lags, 0.95)),
        "freshness_max_s": rnd(max(lags, default=None)),
        "status_writes_seen_per_job_per_update": round(writes_window / args.jobs / updates, 3),
        "controller_writes_per_job_per_update": (
            None
            if writes is None
            else round((writes - before.get("progress_writes", 0)) / args.jobs / updates, 3)
        ),
        "api_requests_per_job_per_min_by_verb": verbs or None,
        "api_requests_per_job_per_min": round(sum(verbs.values()), 3) if verbs else None,
        "cpu_cores": round((cpu1 - cpu0) / elapsed, 3),
        "peak_rss_mb": round(hwm / 2**20),
    }


async def main() -> None:
    from localcluster import LocalCluster
    from localcluster.processes import free_port
    from reconciler import Client, Informer
    from reconciler.config import load_kubeconfig
    from reconciler.resources import Resource

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--update", type=float, default=10.0, help="seconds between a job's pushes")
    ap.add_argument("--measure", type=float, default=None, help="default max(120, 12 x update)")
    ap.add_argument("--generators", type=int, default=2, help="load generator processes")
    ap.add_argument("--connections", type=int, default=64, help="per generator (keep-alive)")
    ap.add_argument("--random-phase", action="store_true", help="default: phases in job order")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--warmup-timeout", type=float, default=900.0)
    ap.add_argument(
        "--no-peer", dest="peer", action="store_false", help="skip Trainer's status server"
    )
    ap.add_argument(
        "--peer-status-qps",
        type=float,
        default=5.0,
        help="Trainer's statusServer.qps (its default: 5; burst twice it)",
    )
    ap.add_argument("extra", nargs="*", help="extra kubeckpt-reconciler flags (after --)")
    args = ap.parse_args()
    if args.measure is None:
        args.measure = max(120.0, 12 * args.update)

    # The peer verifies tokens by OIDC discovery of their issuer: a loopback one (cluster.py).
    cluster = LocalCluster(nodes=3, loopback_issuer=args.peer)
    cluster.start()
    proc = None
    results: list[dict[str, Any]] = []
    try:
        pb.prepare(cluster)
        cfg = load_kubeconfig(cluster.kubeconfig)
        cfg.qps = None
        work = cluster.workdir
        assert work is not None
        ca_file = make_certs(work / "push-certs")
        async with Client(cfg) as client:
            t0 = time.monotonic()
            await pb.setup(client, work / "bench-exec", args.jobs, args.update)
            tokens = await pod_tokens(client, args.jobs)
            print(
                f"setup: {args.jobs} jobs, {2 * args.jobs} pods, {len(tokens)} bound tokens "
                f"in {time.monotonic() - t0:.0f}s",
                flush=True,
            )
            metrics_port, push_port = free_port(), free_port()
            proc = pb.spawn_reconciler(
                cluster,
                metrics_port,
                [
                    "--progress-push-port",
                    str(push_port),
                    "--progress-push-cert-dir",
                    str(work / "push-certs"),
                    *args.extra,
                ],
            )
            # Pods push from their start: the generators begin once the reconciler has made
            # every job's TrainingProgress (a push before it is refused, 409).
            t0 = time.monotonic()
            tps = Informer(client.api(pb.TPS), namespace=pb.NS)
            probe = asyncio.create_task(tps.run())
            while len(tps.store) < args.jobs:
                if time.monotonic() - t0 > args.warmup_timeout:
                    raise SystemExit("warm-up (every job's TrainingProgress made) timed out")
                await asyncio.sleep(1)
            probe.cancel()
            print(f"every TrainingProgress made after {time.monotonic() - t0:.0f}s", flush=True)
            ours = Phase(
                "kubeckpt",
                f"https://127.0.0.1:{push_port}/apis/kubeflow.org/v1/namespaces/{pb.NS}"
                "/pytorchjobs/{name}/status",
                ca_file,
                tokens,
                Informer(client.api(pb.TPS), namespace=pb.NS),
                step_of_progress,
                proc.pid,
                metrics_port,
                args.warmup_timeout,
            )
            results.append(await run_phase(ours, args, work))
            results[-1]["flags"] = args.extra
            print(json.dumps(results[-1], indent=2), flush=True)
            pb.stop_reconciler(proc)  # the peer alone, as in a cluster without kubeckpt
            proc = None
            if args.peer:
                results.append(await trainer_phase(cluster, client, args, work, Resource))
                print(json.dumps(results[-1], indent=2), flush=True)
        print(summary(results))
    finally:
        pb.stop_reconciler(proc)
        cluster.stop()


async def trainer_phase(
    cluster: Any, client: Any, args: argparse.Namespace, work: Path, resource: Any
) -> dict[str, Any]:
    """The same pushes, for TrainJobs of the same names, to Trainer's status server (Trainer
    v2.3.0 with its TrainJobStatus gate; its status client at --peer-status-qps, burst twice
    that: Trainer's defaults are 5 and 10)."""
    from reconciler import Informer

    t0 = time.monotonic()
    qps = args.peer_status_qps
    trainer = await asyncio.to_thread(
        cluster.start_trainer, status_gate=True, status_qps=qps, status_burst=max(1, int(2 * qps))
    )
    trainjobs = client.api(resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"))

    async def create(i: int) -> None:
        await trainjobs.create(
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": f"job-{i:04d}", "namespace": pb.NS},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True},
            }
        )

    await pb.gather_bounded(16, (create(i) for i in range(args.jobs)))
    tokens = await pod_tokens(
        client,
        args.jobs,
        audience=lambda job: (
            f"trainer.kubeflow.org/v1alpha1/namespaces/{pb.NS}/trainjobs/{job}/status"
        ),
    )
    print(
        f"trainer: started, {args.jobs} suspended TrainJobs and their tokens in "
        f"{time.monotonic() - t0:.0f}s",
        flush=True,
    )
    popen = cluster.procs["trainer"].popen
    ph = Phase(
        "trainer",
        f"https://127.0.0.1:{trainer.status_port}/apis/trainer.kubeflow.org/v1alpha1/namespaces/"
        f"{pb.NS}/trainjobs/{{name}}/status",
        work / "trainer" / "ca.crt",
        tokens,
        Informer(trainjobs, namespace=pb.NS),
        step_of_trainjob,
        popen.pid,
        None,
        3 * args.update + 10,  # no review budget to wait for; a slow server shows as unseen
    )
    result = await run_phase(ph, args, work)
    result["status_client_qps_burst"] = [qps, max(1, int(2 * qps))]
    return result


def summary(results: list[dict[str, Any]]) -> str:
    """One table: each server's figures, the issue's targets beside kubeckpt's, and the ratio
    kubeckpt / Trainer where both have the figure."""
    ours = results[0]
    peer = results[1] if len(results) > 1 else None

    def ratio(key: str) -> str:
        a, b = ours.get(key), (peer or {}).get(key)
        return (
            f"{a / b:.2f}x"
            if isinstance(a, int | float) and isinstance(b, int | float) and b
            else ""
        )

    def verdict(ok: bool | None) -> str:
        return "" if ok is None else ("met" if ok else "MISSED")

    p95 = ours["freshness_p95_s"]
    rows = [
        (
            "freshness p95 (s)",
            "freshness_p95_s",
            "<= 15",
            verdict(None if p95 is None else p95 <= 15),
        ),
        ("freshness p50 (s)", "freshness_p50_s", "", ""),
        ("accepted pushes not shown", "freshness_unseen", "", ""),
        ("peak RSS (MiB)", "peak_rss_mb", "<= 572 (600 MB)", verdict(ours["peak_rss_mb"] <= 572)),
        (
            "status writes per job per update",
            "status_writes_seen_per_job_per_update",
            "<= 1",
            verdict(ours["status_writes_seen_per_job_per_update"] <= 1.0),
        ),
        ("API requests per job per min", "api_requests_per_job_per_min", "(report)", ""),
        ("CPU (cores)", "cpu_cores", "(report)", ""),
        ("pushes due per s", "pushes_due_per_s", "", ""),
        ("pushes sent per s (generators)", "pushes_sent_per_s", "= due", ""),
        ("pushes accepted per s", "pushes_accepted_per_s", "= due", ""),
        ("push answer p95 (s)", "push_answer_p50_p95_s", "", ""),
        ("pushes by code", "pushes_by_code", "all 200", ""),
    ]
    head = ["", "kubeckpt"] + (["Trainer status server", "kubeckpt / Trainer"] if peer else [])
    lines = [" | ".join([*head, "target (kubeckpt)", "verdict"])]
    for label, key, target, ok in rows:
        cells = [label, _cell(ours.get(key))]
        if peer:
            cells += [_cell(peer.get(key)), ratio(key)]
        lines.append(" | ".join([*cells, target, ok]))
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, list):
        return str(v[-1])
    if isinstance(v, dict):
        return json.dumps(v)
    return "n/a" if v is None else str(v)


if __name__ == "__main__":
    asyncio.run(main())
