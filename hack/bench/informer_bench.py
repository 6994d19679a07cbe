"""Reconciler library benchmark (issue 4): informer initial sync, watch throughput, exec round trip.

Usage: python hack/bench/informer_bench.py [--objects 10000] [--runs 3] [--execs 200]
(starts its own local control plane, one KWOK node, for the run)

1. Initial sync of N ConfigMaps (about 1 KiB each): our informer (paginated LIST into its cache)
   beside a plain LIST with the official `kubernetes` client, deserialised into its models as a
   caller gets them, and the same LIST read as raw JSON (`_preload_content=False`). Each is a
   separate process, so peak RSS (ru_maxrss) is its own; the baseline is the RSS after imports.
2. Watch throughput: each watcher (ours: an informer; official: `kubernetes.watch.Watch`) runs in
   its own process while N patches are made; events/s as received, and CPU time per event (the
   watcher's own cost, which bounds its capacity on one core).
3. Exec round trip: `true` run in a KWOK pod through the API server, our websocket client beside
   `kubectl exec` (a process per exec, as scripts use it); p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXEC_NS = "exec-bench"
sys.path[:0] = [str(REPO), str(REPO / "hack")]


def rss_bytes() -> int:
    """Peak RSS of this process image (VmHWM; ru_maxrss would include the parent's before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --- children: one measurement each, JSON on stdout ---


async def child_ours_sync(kubeconfig: str, ns: str, page_size: int | None) -> dict:
    from reconciler import Client, Informer
    from reconciler.resources import CONFIGMAPS

    base = rss_bytes()
    async with Client.from_kubeconfig(kubeconfig) as client:
        inf = Informer(client.api(CONFIGMAPS), namespace=ns, page_size=page_size)
        t0 = time.perf_counter()
        task = asyncio.create_task(inf.run())
        await inf.wait_for_sync()
        elapsed = time.perf_counter() - t0
        n = len(inf.store)
        task.cancel()
    return {"seconds": elapsed, "objects": n, "rss": rss_bytes(), "base_rss": base}


def child_official_sync(kubeconfig: str, ns: str, raw: bool) -> dict:
    from kubernetes import client, config

    base = rss_bytes()
    config.load_kube_config(kubeconfig)
    api = client.CoreV1Api()
    t0 = time.perf_counter()
    if raw:
        resp = api.list_namespaced_config_map(ns, _preload_content=False)
        items = json.loads(resp.data)["items"]
        n = len(items)
    else:
        items = api.list_namespaced_config_map(ns).items
        n = len(items)
    elapsed = time.perf_counter() - t0
    return {"seconds": elapsed, "objects": n, "rss": rss_bytes(), "base_rss": base}


async def child_ours_watch(kubeconfig: str, ns: str, expect: int) -> dict:
    from reconciler import Client, EventHandler, Informer
    from reconciler.resources import CONFIGMAPS

    async with Client.from_kubeconfig(kubeconfig) as client:
        inf = Informer(client.api(CONFIGMAPS), namespace=ns)
        times: list[float] = []
        done = asyncio.Event()

        def updated(_old: dict, _new: dict) -> None:
            times.append(time.perf_counter())
            if len(times) >= expect:
                done.set()

        inf.add_handler(EventHandler(on_update=updated))
        task = asyncio.create_task(inf.run())
        await inf.wait_for_sync()
        cpu0 = cpu_seconds()
        print("ready", flush=True)
        await done.wait()
        cpu = cpu_seconds() - cpu0
        task.cancel()
    return {"events": len(times), "first": times[0], "last": times[-1], "cpu": cpu}


def child_official_watch(kubeconfig: str, ns: str, expect: int) -> dict:
    from kubernetes import client, config, watch

    config.load_kube_config(kubeconfig)
    api = client.CoreV1Api()
    rv = api.list_namespaced_config_map(ns, limit=1).metadata.resource_version
    times: list[float] = []
    w = watch.Watch()
    cpu0 = cpu_seconds()
    print("ready", flush=True)
    for ev in w.stream(api.list_namespaced_config_map, ns, resource_version=rv):
        if ev["type"] == "MODIFIED":
            times.append(time.perf_counter())
            if len(times) >= expect:
                break
    w.stop()
    return {"events": len(times), "first": times[0], "last": times[-1], "cpu": cpu_seconds() - cpu0}


def run_child(argv: list[str]) -> None:
    mode, kubeconfig, ns = argv[0], argv[1], argv[2]
    if mode in ("ours-sync", "ours-unpaged-sync"):
        page_size = None if mode == "ours-unpaged-sync" else 500
        out = asyncio.run(child_ours_sync(kubeconfig, ns, page_size))
    elif mode in ("official-sync", "official-raw-sync"):
        out = child_official_sync(kubeconfig, ns, raw=mode == "official-raw-sync")
    elif mode == "ours-watch":
        out = asyncio.run(child_ours_watch(kubeconfig, ns, int(argv[3])))
    elif mode == "official-watch":
        out = child_official_watch(kubeconfig, ns, int(argv[3]))
    else:
        raise SystemExit(f"unknown child mode {mode}")
    print(json.dumps(out), flush=True)


# --- the parent ---


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'hack'}"}
    return subprocess.Popen(
        [sys.executable, __file__, "child", *args], stdout=subprocess.PIPE, text=True, env=env
    )


def measure(*args: str) -> dict:
    proc = spawn(*args)
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def unthrottled(kubeconfig: str):  # type: ignore[no-untyped-def]
    """A client without client-side QPS limits: the load generators push the API server."""
    from reconciler import connect, load_kubeconfig

    cfg = load_kubeconfig(kubeconfig)
    cfg.qps = None
    return connect(cfg)


async def seed(kubeconfig: str, ns: str, n: int) -> float:
    from reconciler.resources import CONFIGMAPS, NAMESPACES

    async with unthrottled(kubeconfig) as client:
        await client.api(NAMESPACES).create({"metadata": {"name": ns}})
        cms = client.api(CONFIGMAPS)
        sem = asyncio.Semaphore(64)
        payload = "x" * 900

        async def make(i: int) -> None:
            async with sem:
                await cms.create(
                    {
                        "metadata": {"name": f"cm-{i:05d}", "labels": {"bench": "informer"}},
                        "data": {"index": str(i), "payload": payload},
                    },
                    ns,
                )

        t0 = time.perf_counter()
        await asyncio.gather(*(make(i) for i in range(n)))
        return time.perf_counter() - t0


async def patch_all(kubeconfig: str, ns: str, n: int, round_: int) -> tuple[float, float]:
    from reconciler.resources import CONFIGMAPS

    async with unthrottled(kubeconfig) as client:
        cms = client.api(CONFIGMAPS)
        sem = asyncio.Semaphore(64)

        async def patch(i: int) -> None:
            async with sem:
                await cms.patch(f"cm-{i:05d}", {"data": {"round": str(round_)}}, ns)

        t0 = time.perf_counter()
        await asyncio.gather(*(patch(i) for i in range(n)))
        return t0, time.perf_counter()


def watch_bench(kubeconfig: str, ns: str, n: int, mode: str, round_: int) -> dict:
    proc = spawn(mode, kubeconfig, ns, str(n))
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"{mode} did not start")
    start, end = asyncio.run(patch_all(kubeconfig, ns, n, round_))
    out, _ = proc.communicate(timeout=600)
    res = json.loads(out.strip().splitlines()[-1])
    res["writes_per_s"] = n / (end - start)
    res["events_per_s"] = res["events"] / (res["last"] - start)
    res["lag_s"] = res["last"] - end
    res["cpu_us_per_event"] = res["cpu"] / res["events"] * 1e6
    return res


async def exec_bench(kubeconfig: str, ns: str, pod: str, n: int) -> tuple[list[float], int]:
    from reconciler import KubeError, exec_command

    # Unthrottled: with the default 20 QPS the loop would measure the client's rate limit.
    async with unthrottled(kubeconfig) as client:
        await exec_command(client, ns, pod, ["true"])  # warm up (TLS session, imports)
        times, failed = [], 0
        for _ in range(n):
            t0 = time.perf_counter()
            try:
                r = await exec_command(client, ns, pod, ["true"])
            except KubeError as e:
                failed += 1
                print(f"exec failed: {e}", flush=True)
                continue
            times.append(time.perf_counter() - t0)
            assert r.exit_code == 0
        return times, failed


def kubectl_exec_bench(cluster: object, ns: str, pod: str, n: int) -> tuple[list[float], int]:
    times, failed = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        proc = cluster.kubectl("exec", "-n", ns, pod, "--", "true", check=False)  # type: ignore[attr-defined]
        if proc.returncode != 0:
            failed += 1
            print(f"kubectl exec failed: {proc.stderr.strip()}", flush=True)
            continue
        times.append(time.perf_counter() - t0)
    return times, failed


def setup_exec_pod(cluster: Any) -> None:
    from localcluster import wait_for

    cluster.kubectl("create", "namespace", EXEC_NS)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "exec-bench", "namespace": EXEC_NS},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
    )
    cluster.exec_dir(EXEC_NS, "exec-bench")
    wait_for(
        lambda: (
            cluster.kubectl(
                "exec", "-n", EXEC_NS, "exec-bench", "--", "true", check=False
            ).returncode
            == 0
        ),
        "exec",
        timeout=60,
    )


def run_exec_benches(cluster: Any, n: int) -> dict:
    ours, ours_failed = asyncio.run(exec_bench(str(cluster.kubeconfig), EXEC_NS, "exec-bench", n))
    kubectl, kubectl_failed = kubectl_exec_bench(cluster, EXEC_NS, "exec-bench", n)
    return {
        "ours": ours,
        "ours_failed": ours_failed,
        "kubectl": kubectl,
        "kubectl_failed": kubectl_failed,
    }


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def mib(b: float) -> str:
    return f"{b / 2**20:.0f} MiB"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        run_child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--execs", type=int, default=200)
    args = ap.parse_args()

    from localcluster import LocalCluster

    cluster = LocalCluster(nodes=1)
    cluster.start()
    try:
        kubeconfig = str(cluster.kubeconfig)
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        setup_exec_pod(cluster)
        exec_results = {"idle": run_exec_benches(cluster, args.execs)}
        took = asyncio.run(seed(kubeconfig, ns, args.objects))
        print(f"seeded {args.objects} ConfigMaps in {took:.1f} s", flush=True)

        sync: dict[str, list[dict]] = {
            "ours": [],
            "ours-unpaged": [],
            "official": [],
            "official-raw": [],
        }
        for r in range(args.runs):
            for name in sync:
                res = measure(f"{name}-sync", kubeconfig, ns)
                assert res["objects"] >= args.objects, res
                sync[name].append(res)
                print(
                    f"run {r + 1} {name}: {res['seconds']:.2f} s, peak RSS {mib(res['rss'])}",
                    flush=True,
                )

        def med(name: str, key: str) -> float:
            return statistics.median(x[key] for x in sync[name])

        watches = {}
        for i, mode in enumerate(("ours-watch", "official-watch")):
            watches[mode] = watch_bench(kubeconfig, ns, args.objects, mode, i)
            w = watches[mode]
            print(
                f"{mode}: {w['events_per_s']:.0f} events/s received (writes "
                f"{w['writes_per_s']:.0f}/s), {w['cpu_us_per_event']:.0f} us CPU/event",
                flush=True,
            )

        exec_results["loaded"] = run_exec_benches(cluster, args.execs)
    finally:
        cluster.stop()

    n = args.objects
    t = {name: med(name, "seconds") for name in sync}
    rss = {name: med(name, "rss") for name in sync}
    base = {name: med(name, "base_rss") for name in sync}
    ow, fw = watches["ours-watch"], watches["official-watch"]
    print()
    print("| what | ours | official `kubernetes` client | ratio (ours / official) |")
    print("| --- | --- | --- | --- |")
    print(
        f"| initial sync of {n:,} ConfigMaps, median of {args.runs}: time | {t['ours']:.2f} s "
        f"(informer, pages of 500); {t['ours-unpaged']:.2f} s (page_size=None) | "
        f"{t['official']:.2f} s (one LIST into models); {t['official-raw']:.2f} s (raw JSON) | "
        f"{t['ours'] / t['official']:.2f}; unpaged {t['ours-unpaged'] / t['official']:.2f} |"
    )
    print(
        f"| same: peak RSS (after-import baseline) | {mib(rss['ours'])} ({mib(base['ours'])}); "
        f"unpaged {mib(rss['ours-unpaged'])} | {mib(rss['official'])} "
        f"({mib(base['official'])}); raw {mib(rss['official-raw'])} | "
        f"{rss['ours'] / rss['official']:.2f}; growth over baseline "
        f"{(rss['ours'] - base['ours']) / (rss['official'] - base['official']):.2f} |"
    )
    print(
        f"| watch: {n:,} MODIFIED events while 64 writers patch | {ow['events_per_s']:.0f} "
        f"events/s (writes {ow['writes_per_s']:.0f}/s, lag {ow['lag_s']:.2f} s) | "
        f"{fw['events_per_s']:.0f} events/s (writes {fw['writes_per_s']:.0f}/s, lag "
        f"{fw['lag_s']:.2f} s) | {ow['events_per_s'] / fw['events_per_s']:.2f} |"
    )
    print(
        f"| watch: CPU per event in the watcher (capacity on one core) | "
        f"{ow['cpu_us_per_event']:.0f} us ({1e6 / ow['cpu_us_per_event']:,.0f}/s) | "
        f"{fw['cpu_us_per_event']:.0f} us ({1e6 / fw['cpu_us_per_event']:,.0f}/s) | "
        f"{ow['cpu_us_per_event'] / fw['cpu_us_per_event']:.2f} |"
    )
    for when, what in (("idle", "an idle cluster"), ("loaded", "after the load above")):
        e = exec_results[when]
        o, k = e["ours"], e["kubectl"]
        print(
            f"| exec round trip of `true`, {args.execs} sequential, {what} (p50 / p99) | "
            f"{pct(o, 50) * 1000:.1f} / {pct(o, 99) * 1000:.1f} ms (websocket; "
            f"{e['ours_failed']} failed) | {pct(k, 50) * 1000:.1f} / {pct(k, 99) * 1000:.1f} ms "
            f"(`kubectl exec`, a process each; {e['kubectl_failed']} failed) | "
            f"{pct(o, 50) / pct(k, 50):.2f} (p50) |"
        )


if __name__ == "__main__":
    main()
