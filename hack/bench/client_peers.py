"""Our client, informer, exec and leader election beside the official clients (issue 16).

Usage: PYTHONPATH=hack python hack/bench/client_peers.py [--sizes 5000,20000] [--rounds 3]
       [--updates 200] [--execs 200] [--lease 15,10,2] [--window 60]
       [--parts list,informer,exec,leader] [--leader-only ours|official]
(starts its own local control plane, one KWOK node, for the run; about 16 minutes by default)

One run, one API server, the same ConfigMaps (about 1 KiB each, as informer_bench.py) for every
contender. Each part runs a warm-up round (discarded) and then `--rounds` rounds; the contenders'
order is reversed every other round. Every measurement is a process of its own, so peak RSS
(VmHWM) is its own and no contender inherits another's warm caches. Figures are the median and
[min-max] over the rounds; a ratio is printed only where the two spreads do not overlap.

1. LIST all in pages of 500: ours (`ResourceClient.list_all`, plain dicts) beside the official
   sync client and `kubernetes.aio`, both with the raw response json.loads'ed per page (the same
   output form), and both into their models (labelled so).
2. Informer: initial sync (LIST, then WATCH) until the cache holds every object, then the latency
   of `--updates` sequential patches from the write being sent to the handler being called. Ours
   (paged, and unpaged) beside `kubernetes.informer.SharedInformer` (threads; one unpaged LIST
   into models: it has no paging).
3. Exec: `cat` of a small file in a KWOK pod, `--execs` times sequentially and with 10 at once:
   ours (`exec_command`, which negotiates v5) beside `kubernetes.aio.stream.WsApiClient` told to
   use v5 and with its default, v4; the output is checked; peak RSS and open fds after. Once
   each: what comes back for stderr, an exit status and binary output.
4. Leader election: two candidates on one Lease, each through its own TCP proxy; the leader's
   proxy is blackholed (a silent partition). Failover: from the cut to the new leader's first
   action. Overlap: the old leader's last action minus the new one's first (> 0: both acted at
   once, the fencing failed). Ours (`LeaderElector`) beside `kubernetes.aio.leaderelection` with a
   LeaseLock, same lease duration, renew deadline and retry period. `--leader-only official
   --window 330` watches past aiohttp's 300 s default request timeout.

The clients are unthrottled (ours has client-side QPS 20 / burst 30 by default; the official
clients have none), so the figures compare the clients, not a rate limit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchstats import DASH, med, ratio, spread

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "hack"), str(REPO / "tests" / "integration" / "reconciler")]

PAGE = 500
EXEC_NS, EXEC_POD = "peers-exec", "exec-peer"
SMALL = b"kubeckpt exec benchmark: a small file\n" * 4
BLOB = bytes(range(256)) * 256  # 64 KiB of every byte value, for the probe
ACT_PERIOD = 0.05  # a leader "acts" (logs a timestamp) this often
V5 = "v5.channel.k8s.io"


def peak_rss() -> int:
    """Peak RSS of this process image (VmHWM; ru_maxrss would include the parent's before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


_base_rss = 0


def mark_base() -> None:
    """The baseline: peak RSS once the contender's modules are imported and its client set up."""
    global _base_rss
    _base_rss = peak_rss()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def names_digest(names: Sequence[str]) -> str:
    """Every contender must return the same objects: compared by a digest of the sorted names."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def ours_config(kubeconfig: str, server: str = "") -> Any:
    from reconciler import load_kubeconfig

    cfg = load_kubeconfig(kubeconfig)
    cfg.qps = None  # unthrottled, as the official clients are
    if server:
        cfg.server = server
    return cfg


async def aio_configuration(kubeconfig: str, server: str = "") -> Any:
    from kubernetes.aio import client, config

    conf = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
    if server:
        conf.host = server
    return conf


# --- children: one measurement each, JSON on the last line of stdout ---


async def list_ours(kubeconfig: str, ns: str) -> tuple[float, list[dict], int]:
    from reconciler import Client
    from reconciler.resources import CONFIGMAPS

    async with Client(ours_config(kubeconfig)) as client:
        mark_base()
        t0 = time.perf_counter()
        res = await client.api(CONFIGMAPS).list_all(ns, page_size=PAGE)
        took = time.perf_counter() - t0
    return took, res.items, res.pages


def list_sync(kubeconfig: str, ns: str, models: bool) -> tuple[float, list[Any], int]:
    from kubernetes import client, config

    config.load_kube_config(kubeconfig)
    api = client.CoreV1Api()
    items: list[Any] = []
    token, pages = None, 0
    mark_base()
    t0 = time.perf_counter()
    while True:
        pages += 1
        if models:
            page = api.list_namespaced_config_map(ns, limit=PAGE, _continue=token)
            items.extend(page.items)
            token = page.metadata.var_continue
        else:
            resp = api.list_namespaced_config_map(
                ns, limit=PAGE, _continue=token, _preload_content=False
            )
            body = json.loads(resp.data)
            items.extend(body["items"])
            token = body["metadata"].get("continue")
        if not token:
            break
    return time.perf_counter() - t0, items, pages


async def list_aio(kubeconfig: str, ns: str, models: bool) -> tuple[float, list[Any], int]:
    from kubernetes.aio import client

    conf = await aio_configuration(kubeconfig)
    async with client.ApiClient(conf) as api_client:
        api = client.CoreV1Api(api_client)
        items: list[Any] = []
        token, pages = None, 0
        mark_base()
        t0 = time.perf_counter()
        while True:
            pages += 1
            if models:
                page = await api.list_namespaced_config_map(ns, limit=PAGE, _continue=token)
                items.extend(page.items)
                token = page.metadata.var_continue
            else:
                # This generation of the aio client has no _preload_content= argument: the raw
                # response comes from the *_without_preload_content twin of each method.
                resp = await api.list_namespaced_config_map_without_preload_content(
                    ns, limit=PAGE, _continue=token
                )
                body = json.loads(await resp.read())
                items.extend(body["items"])
                token = body["metadata"].get("continue")
            if not token:
                break
        return time.perf_counter() - t0, items, pages


def child_list(impl: str, kubeconfig: str, ns: str) -> dict:
    if impl == "ours":
        took, items, pages = asyncio.run(list_ours(kubeconfig, ns))
    elif impl in ("sync-json", "sync-models"):
        took, items, pages = list_sync(kubeconfig, ns, models=impl == "sync-models")
    elif impl in ("aio-json", "aio-models"):
        took, items, pages = asyncio.run(list_aio(kubeconfig, ns, models=impl == "aio-models"))
    else:
        raise SystemExit(f"unknown list contender {impl}")
    rss = peak_rss()  # before the digest, which is not part of the work
    form = type(items[0]).__name__
    if impl.endswith("models"):
        names = [i.metadata.name for i in items]
    else:
        names = [i["metadata"]["name"] for i in items]
    return {
        "seconds": took,
        "objects": len(items),
        "pages": pages,
        "form": form,
        "digest": names_digest(names),
        "rss": rss,
        "base_rss": _base_rss,
    }


def announce(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


async def informer_ours(kubeconfig: str, ns: str, objects: int, tag: str, n: int, paged: bool):
    from reconciler import Client, EventHandler, Informer
    from reconciler.resources import CONFIGMAPS

    got: dict[str, float] = {}
    done = asyncio.Event()
    added = 0

    def on_add(_obj: dict) -> None:
        nonlocal added
        added += 1

    def on_update(_old: dict, new: dict) -> None:
        seq = (new.get("data") or {}).get("seq", "")
        if seq.startswith(tag) and seq not in got:
            got[seq] = time.monotonic()
            if len(got) >= n:
                done.set()

    async with Client(ours_config(kubeconfig)) as client:
        inf = Informer(client.api(CONFIGMAPS), namespace=ns, page_size=PAGE if paged else None)
        inf.add_handler(EventHandler(on_add=on_add, on_update=on_update))
        mark_base()
        t0 = time.perf_counter()
        task = asyncio.create_task(inf.run())
        await inf.wait_for_sync()
        took = time.perf_counter() - t0
        rss = peak_rss()
        assert added == len(inf.store) >= objects, (added, len(inf.store))
        await asyncio.sleep(1)  # let the watch open, as for the official one
        announce(seconds=took, objects=len(inf.store), rss=rss, base_rss=_base_rss)
        await asyncio.wait_for(done.wait(), 120)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return {"received": got}


def informer_official(kubeconfig: str, ns: str, objects: int, tag: str, n: int) -> dict:
    from kubernetes import client, config
    from kubernetes.informer import ADDED, MODIFIED, SharedInformer

    config.load_kube_config(kubeconfig)
    api = client.CoreV1Api()
    inf = SharedInformer(api.list_namespaced_config_map, namespace=ns)
    synced, done = threading.Event(), threading.Event()
    got: dict[str, float] = {}
    added = 0

    # It has no has_synced: its initial LIST fires ADDED for every item, so the N-th is the sync.
    def on_add(_obj: Any) -> None:
        nonlocal added
        added += 1
        if added >= objects:
            synced.set()

    def on_modified(obj: Any) -> None:
        seq = (obj.data or {}).get("seq", "")
        if seq.startswith(tag) and seq not in got:
            got[seq] = time.monotonic()
            if len(got) >= n:
                done.set()

    inf.add_event_handler(ADDED, on_add)
    inf.add_event_handler(MODIFIED, on_modified)
    mark_base()
    t0 = time.perf_counter()
    inf.start()
    if not synced.wait(300):
        raise RuntimeError(f"official informer: {added} of {objects} added")
    took = time.perf_counter() - t0
    rss = peak_rss()
    time.sleep(1)  # its watch opens after the LIST's handlers have run
    announce(seconds=took, objects=len(inf.cache.list_keys()), rss=rss, base_rss=_base_rss)
    if not done.wait(120):
        raise RuntimeError(f"official informer: {len(got)} of {n} updates")
    # stop() would wait for the watch's next event (Watch.stop() sets a flag the stream checks per
    # event): the process exits instead, leaving the daemon thread.
    return {"received": got}


async def exec_ours(kubeconfig: str, n: int, conc: int) -> dict:
    from reconciler import Client, exec_command

    async with Client(ours_config(kubeconfig)) as client:

        async def one() -> bytes:
            r = await exec_command(client, EXEC_NS, EXEC_POD, ["cat", "small.txt"])
            if r.exit_code != 0:
                raise RuntimeError(f"exit {r.exit_code}: {r.stderr!r}")
            return r.stdout

        return await timed_execs(one, SMALL, n, conc)


async def exec_official(kubeconfig: str, n: int, conc: int, protocol: str | None) -> dict:
    from kubernetes.aio import client
    from kubernetes.aio.stream import WsApiClient

    conf = await aio_configuration(kubeconfig)
    # WsApiClient offers v4 unless told otherwise; ours negotiates v5. Both are measured.
    headers = {"sec-websocket-protocol": protocol} if protocol else None
    async with WsApiClient(configuration=conf) as ws:
        api = client.CoreV1Api(api_client=ws)

        async def one() -> bytes:
            out = await api.connect_get_namespaced_pod_exec(
                EXEC_POD,
                EXEC_NS,
                command=["cat", "small.txt"],
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
                _headers=headers,
            )
            return out.encode()

        return await timed_execs(one, SMALL, n, conc)


async def timed_execs(one: Callable[[], Any], want: bytes, n: int, conc: int) -> dict:
    if await one() != want:  # warm-up: connection, TLS, imports
        raise RuntimeError("wrong output")
    mark_base()
    fds0 = open_fds()
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    wrong = 0

    async def timed() -> None:
        nonlocal wrong
        async with sem:
            t = time.perf_counter()
            out = await one()
            lat.append(time.perf_counter() - t)
            wrong += out != want

    t0 = time.perf_counter()
    await asyncio.gather(*(timed() for _ in range(n)))
    total = time.perf_counter() - t0
    await asyncio.sleep(0.2)  # let closed websockets' sockets go before counting fds
    return {
        "total": total,
        "p50": statistics.median(lat),
        "wrong": wrong,
        "fds_before": fds0,
        "fds_after": open_fds(),
        "rss": peak_rss(),
        "base_rss": _base_rss,
    }


PROBES = {
    "stderr and exit 3": ["sh", "-c", "printf out; printf err >&2; exit 3"],
    "64 KiB binary": ["cat", "blob.bin"],
}


async def exec_probe(kubeconfig: str, impl: str) -> dict:
    """What each client hands back for stderr, a non-zero exit and binary output (not timed)."""
    out: dict[str, str] = {}
    if impl == "ours":
        from reconciler import Client, exec_command

        async with Client(ours_config(kubeconfig)) as client:
            for what, argv in PROBES.items():
                r = await exec_command(client, EXEC_NS, EXEC_POD, argv)
                exact = "exact bytes" if r.stdout == BLOB else repr(r.stdout[:16])
                out[what] = f"stdout {exact}, stderr {r.stderr[:16]!r}, exit {r.exit_code}"
        return out
    from kubernetes.aio import client
    from kubernetes.aio.stream import WsApiClient

    conf = await aio_configuration(kubeconfig)
    async with WsApiClient(configuration=conf) as ws:
        api = client.CoreV1Api(api_client=ws)
        for what, argv in PROBES.items():
            try:
                s = await api.connect_get_namespaced_pod_exec(
                    EXEC_POD, EXEC_NS, command=argv, stderr=True, stdout=True, stdin=False,
                    tty=False, _headers={"sec-websocket-protocol": V5},
                )  # fmt: skip
                exact = "exact bytes" if s.encode() == BLOB else repr(s[:16])
                out[what] = f"one str {exact} (stdout and stderr merged), no exit status"
            except Exception as e:  # what it raises is the finding
                out[what] = f"raised {type(e).__name__}: {str(e)[:80]}"
    return out


class EventLog:
    """Lines "<what> <monotonic time>", one write(2) each, so a SIGKILL loses none."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, what: str) -> None:
        os.write(self.fd, f"{what} {time.monotonic():.6f}\n".encode())


async def leader_ours(kubeconfig: str, server: str, ns: str, lease: str, ident: str,
                      timing: tuple[float, float, float], log: EventLog) -> None:  # fmt: skip
    from reconciler import Client, LeaderElectionConfig, LeaderElector

    dur, renew, retry = timing
    cfg = LeaderElectionConfig(
        lease, ns, identity=ident, lease_duration=dur, renew_deadline=renew, retry_period=retry
    )
    async with Client(ours_config(kubeconfig, server)) as client:
        le = LeaderElector(
            client,
            cfg,
            on_started_leading=lambda: log("started"),
            on_stopped_leading=lambda: log("stopped"),
        )

        async def lead() -> None:
            while True:
                log("act")
                await asyncio.sleep(ACT_PERIOD)

        await le.run(lead)  # campaigns again after losing; never returns here


async def leader_official(kubeconfig: str, server: str, ns: str, lease: str, ident: str,
                          timing: tuple[float, float, float], log: EventLog) -> None:  # fmt: skip
    from kubernetes.aio import client
    from kubernetes.aio.leaderelection import electionconfig, leaderelection
    from kubernetes.aio.leaderelection.resourcelock.leaselock import LeaseLock

    # Whole seconds as ints: LeaseLock writes int(str(lease_duration)), which fails for "15.0".
    dur, renew, retry = (int(x) if x.is_integer() else x for x in timing)
    conf = await aio_configuration(kubeconfig, server)
    async with client.ApiClient(conf) as api_client:

        async def lead() -> None:
            log("started")
            while True:
                log("act")
                await asyncio.sleep(ACT_PERIOD)

        async def stopped() -> None:
            log("stopped")

        cfg = electionconfig.Config(
            LeaseLock(lease, ns, ident, api_client), dur, renew, retry, lead, stopped
        )
        try:
            await leaderelection.LeaderElection(cfg).run()
            log("returned")
        except Exception as e:  # recorded: what happens to `lead` then matters
            log(f"raised-{type(e).__name__}")
            traceback.print_exc()
        await asyncio.Event().wait()  # the process lives on, as a controller's would


def run_child(argv: list[str]) -> None:
    part, impl = argv[0], argv[1]
    if part == "list":
        out = child_list(impl, argv[2], argv[3])
    elif part == "informer":
        kubeconfig, ns, objects, tag, n = argv[2], argv[3], int(argv[4]), argv[5], int(argv[6])
        if impl == "official":
            out = informer_official(kubeconfig, ns, objects, tag, n)
        else:
            out = asyncio.run(informer_ours(kubeconfig, ns, objects, tag, n, impl == "ours"))
    elif part == "exec":
        kubeconfig, n, conc = argv[2], int(argv[3]), int(argv[4])
        if impl == "ours":
            out = asyncio.run(exec_ours(kubeconfig, n, conc))
        else:
            protocol = V5 if impl == "official-v5" else None
            out = asyncio.run(exec_official(kubeconfig, n, conc, protocol))
    elif part == "exec-probe":
        out = asyncio.run(exec_probe(argv[2], impl))
    elif part == "leader":
        kubeconfig, server, ns, lease, ident, log_path = argv[2:8]
        timing = (float(argv[8]), float(argv[9]), float(argv[10]))
        run = leader_ours if impl == "ours" else leader_official
        asyncio.run(run(kubeconfig, server, ns, lease, ident, timing, EventLog(log_path)))
        return
    else:
        raise SystemExit(f"unknown child {part}")
    print(json.dumps(out), flush=True)
    if part == "informer":
        os._exit(0)  # the official informer's thread sits in a watch; do not join it


# --- the parent ---


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'hack'}"}


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "child", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def measure(*args: str) -> dict:
    proc = spawn(*args)
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args[:2]} failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def ordered(items: Sequence[str], round_: int) -> list[str]:
    return list(items) if round_ % 2 == 0 else list(reversed(items))


def mib(b: float) -> str:
    return f"{b / 2**20:.0f}"


def rss_cells(xs: list[dict]) -> str:
    """Median peak RSS, the baseline after imports and setup, and the growth over it (MiB)."""
    peak, base = med([x["rss"] for x in xs]), med([x["base_rss"] for x in xs])
    return f"{mib(peak)} ({mib(base)}) | {mib(med([x['rss'] - x['base_rss'] for x in xs]))}"


async def seed(kubeconfig: str, ns: str, n: int) -> float:
    from reconciler import Client
    from reconciler.resources import CONFIGMAPS, NAMESPACES

    async with Client(ours_config(kubeconfig)) as client:
        await client.api(NAMESPACES).create({"metadata": {"name": ns}})
        cms = client.api(CONFIGMAPS)
        sem = asyncio.Semaphore(64)
        payload = "x" * 900

        async def make(i: int) -> None:
            async with sem:
                await cms.create(
                    {
                        "metadata": {"name": f"cm-{i:05d}", "labels": {"bench": "peers"}},
                        "data": {"index": str(i), "payload": payload},
                    },
                    ns,
                )

        t0 = time.perf_counter()
        await asyncio.gather(*(make(i) for i in range(n)))
        return time.perf_counter() - t0


async def patch_sequentially(kubeconfig: str, ns: str, tag: str, n: int, size: int) -> dict:
    """One patch at a time, each to another object; the send time of each, by its value."""
    from reconciler import Client
    from reconciler.resources import CONFIGMAPS

    async with Client(ours_config(kubeconfig)) as client:
        cms = client.api(CONFIGMAPS)
        await cms.get("cm-00000", ns)  # connection up before the first timed write
        sent: dict[str, float] = {}
        for i in range(n):
            seq = f"{tag}-{i}"
            sent[seq] = time.monotonic()
            await cms.patch(f"cm-{(i * 97) % size:05d}", {"data": {"seq": seq}}, ns)
        return sent


def informer_round(kubeconfig: str, ns: str, size: int, impl: str, n: int) -> dict:
    tag = uuid.uuid4().hex[:8]
    proc = spawn("informer", impl, kubeconfig, ns, str(size + 1), tag, str(n))  # + kube-root-ca
    assert proc.stdout is not None
    synced = json.loads(proc.stdout.readline())
    sent = asyncio.run(patch_sequentially(kubeconfig, ns, tag, n, size))
    out, _ = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"informer child {impl} failed ({proc.returncode})")
    got = json.loads(out.strip().splitlines()[-1])["received"]
    lat = sorted(got[k] - sent[k] for k in sent)
    return {**synced, "p50": med(lat), "p99": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]}


def setup_exec_pod(cluster: Any) -> None:
    from localcluster import wait_for

    cluster.kubectl("create", "namespace", EXEC_NS)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": EXEC_POD, "namespace": EXEC_NS},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
    )
    d = cluster.exec_dir(EXEC_NS, EXEC_POD)
    (d / "small.txt").write_bytes(SMALL)
    (d / "blob.bin").write_bytes(BLOB)

    def works() -> bool:
        r = cluster.kubectl("exec", "-n", EXEC_NS, EXEC_POD, "--", "true", check=False)
        return r.returncode == 0

    wait_for(works, "exec", timeout=60)


class Candidate:
    def __init__(self, impl: str, ident: str, log: Path, args: list[str]) -> None:
        """args: kubeconfig, server, namespace, lease, then the three timings."""
        self.ident, self.log = ident, log
        log.touch()
        # The official elector logs a traceback per failed renewal: into a file, not the table.
        with log.with_suffix(".stderr").open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "child", "leader", impl, *args[:4], ident, str(log),
                 *args[4:]],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=child_env(),
            )  # fmt: skip

    def events(self, what: str) -> list[float]:
        return [
            float(t) for w, t in (line.split() for line in self.log.read_text().splitlines())
            if w == what
        ]  # fmt: skip

    def first(self, prefix: str) -> float:
        """When the first event starting with `prefix` happened (NaN: never)."""
        for line in self.log.read_text().splitlines():
            what, t = line.split()
            if what.startswith(prefix):
                return float(t)
        return float("nan")

    def all_events(self) -> list[str]:
        return sorted({line.split()[0] for line in self.log.read_text().splitlines()})

    def stderr_tail(self) -> str:
        return "\n".join(self.log.with_suffix(".stderr").read_text().splitlines()[-30:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def nan_last(x: float) -> tuple[bool, float]:
    return (x != x, x)


async def wait_until(cond: Callable[[], bool], within: float) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if cond():
            return True
        await asyncio.sleep(0.02)
    return cond()


async def create_empty_lease(kubeconfig: str, ns: str, name: str) -> None:
    """kubernetes.aio 37.0.1's LeaseLock cannot create a Lease (it passes pretty=True where its
    validated API takes a string: a pydantic ValidationError), so the Lease exists, unheld,
    before either contender starts."""
    from reconciler import Client
    from reconciler.resources import LEASES

    async with Client(ours_config(kubeconfig)) as client:
        await client.api(LEASES).create(
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": name, "namespace": ns}, "spec": {}}
        )  # fmt: skip


async def leader_round(cluster: Any, impl: str, timing: tuple[float, float, float],
                       window: float, tmp: Path) -> dict:  # fmt: skip
    from tcpproxy import TcpProxy

    dur, _renew, retry = timing
    # Connections the proxies still hold when they stop end as cancelled tasks: not news.
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(
        lambda lp, ctx: (
            None
            if isinstance(ctx.get("exception"), asyncio.CancelledError)
            else lp.default_exception_handler(ctx)
        )
    )
    port = int(cluster.server.rsplit(":", 1)[1])
    ns, lease = "default", f"peers-{impl}-{uuid.uuid4().hex[:6]}"
    proxies = [TcpProxy("127.0.0.1", port), TcpProxy("127.0.0.1", port)]
    cands: list[Candidate] = []
    await create_empty_lease(str(cluster.kubeconfig), ns, lease)
    try:
        for i, p in enumerate(proxies):
            server = f"https://127.0.0.1:{await p.start()}"
            args = [str(cluster.kubeconfig), server, ns, lease, *map(str, timing)]
            cands.append(Candidate(impl, f"{impl}-{i}", tmp / f"{lease}-{i}.log", args))
            if i == 0:  # the first leads before the second starts
                if not await wait_until(lambda: bool(cands[0].events("act")), 60):
                    raise RuntimeError(f"{impl}: no leader\n{cands[0].stderr_tail()}")
        await asyncio.sleep(2 * retry + 1)  # the second has seen the Lease, held
        old, new = cands
        if new.events("act"):
            raise RuntimeError(f"{impl}: two leaders before the cut")
        cut = time.monotonic()
        proxies[0].blackhole()  # the leader's connection: silent, nothing errors
        took_over = await wait_until(lambda: bool(new.events("act")), dur * 3 + 30)
        # Then watch the old leader until it stops acting, for at most `window` after the cut.
        await wait_until(
            lambda: bool(old.events("stopped")), max(0.0, cut + window - time.monotonic())
        )
        await asyncio.sleep(2 * ACT_PERIOD)  # a last action in flight
        end = time.monotonic()
        old_acts, new_acts = old.events("act"), new.events("act")
        first_new = min(new_acts) if took_over else float("nan")
        last_old = max(old_acts)
        still_acting = end - last_old < 4 * ACT_PERIOD
        return {
            "failover": first_new - cut,
            "old_stopped": old.first("stopped") - cut,
            # The official elector's run() raising or returning: it campaigns no more.
            "old_gave_up": min(old.first("raised-"), old.first("returned"), key=nan_last) - cut,
            "old_last_act": last_old - cut,
            "overlap": last_old - first_new,
            "still_acting": still_acting,
            "window": end - cut,
            "old_events": old.all_events(),
        }
    finally:
        for c in cands:
            c.kill()
        for p in proxies:
            await p.stop()
        await asyncio.sleep(0.2)  # their connection handlers wind down


class OthersCpu:
    """CPU that processes outside this benchmark used while a part ran, in cores: how shared the
    machine was. Ours: this process, the children it has waited for, and the cluster's processes
    with the children they reaped (KWOK runs the execs)."""

    def __init__(self, cluster: Any) -> None:
        self.pids = [p.popen.pid for p in cluster.procs.values() if p.popen is not None]
        self.hz = os.sysconf("SC_CLK_TCK")
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) / self.hz  # user nice sys irq soft steal
        ours = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            ours += r.ru_utime + r.ru_stime
        for pid in self.pids:
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/stat").read_text()
                fields = text[text.rfind(")") + 2 :].split()
                ours += sum(int(x) for x in fields[11:15]) / self.hz  # u, s, cu, cs time
        return time.monotonic(), busy, ours

    def cores(self) -> float:
        """Since the last call (or the start)."""
        (t0, b0, o0), (t1, b1, o1) = self.start, self._sample()
        self.start = (t1, b1, o1)
        return max(0.0, ((b1 - b0) - (o1 - o0)) / (t1 - t0))


# --- the parts, and their tables ---

LIST_IMPLS = {
    "ours": "ours, `list_all` (dicts)",
    "sync-json": "official sync, `_preload_content=False` + json.loads (dicts)",
    "aio-json": "`kubernetes.aio`, `*_without_preload_content` + json.loads (dicts)",
    "sync-models": "official sync, into its models",
    "aio-models": "`kubernetes.aio`, into its models",
}


def part_list(kubeconfig: str, sizes: dict[int, str], rounds: int) -> None:
    res: dict[tuple[int, str], list[dict]] = {}
    for r in range(rounds + 1):
        for size, ns in sizes.items():
            for impl in ordered(list(LIST_IMPLS), r):
                x = measure("list", impl, kubeconfig, ns)
                assert x["objects"] == size + 1, x  # and the namespace's kube-root-ca.crt
                print(f"list r{r} {size} {impl}: {x['seconds']:.3f} s {x['form']}", flush=True)
                if r:  # round 0 is the warm-up
                    res.setdefault((size, impl), []).append(x)
    for size in sizes:
        digests = {x["digest"] for impl in LIST_IMPLS for x in res[size, impl]}
        assert len(digests) == 1, f"contenders disagree on the objects: {digests}"
    print(f"\nLIST all in pages of {PAGE}; {rounds} rounds, median [min{DASH}max]")
    print(
        "| ConfigMaps | contender | seconds | ours / this | peak RSS MiB (after imports) "
        "| RSS growth MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        ours = [x["seconds"] for x in res[size, "ours"]]
        for impl, label in LIST_IMPLS.items():
            xs = res[size, impl]
            secs = [x["seconds"] for x in xs]
            vs = "" if impl == "ours" else ratio(ours, secs)
            print(f"| {size:,} | {label} | {spread(secs, 2)} | {vs} | {rss_cells(xs)} |")


INFORMER_IMPLS = {
    "ours": "ours, `Informer` (pages of 500)",
    "ours-unpaged": "ours, `Informer(page_size=None)`",
    "official": "`kubernetes.informer.SharedInformer` (one LIST, models)",
}


def part_informer(kubeconfig: str, sizes: dict[int, str], rounds: int, n: int) -> None:
    res: dict[tuple[int, str], list[dict]] = {}
    for r in range(rounds + 1):
        for size, ns in sizes.items():
            for impl in ordered(list(INFORMER_IMPLS), r):
                x = informer_round(kubeconfig, ns, size, impl, n)
                print(
                    f"informer r{r} {size} {impl}: sync {x['seconds']:.3f} s, update p50 "
                    f"{x['p50'] * 1e3:.1f} ms p99 {x['p99'] * 1e3:.1f} ms",
                    flush=True,
                )
                if r:
                    res.setdefault((size, impl), []).append(x)
    print(
        f"\nInformer: initial sync, then {n} sequential updates; {rounds} rounds, "
        f"median [min{DASH}max]"
    )
    print(
        "| ConfigMaps | contender | sync s | ours / this | peak RSS MiB at sync (after imports) "
        "| RSS growth MiB | update p50 ms | update p99 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        ours = [x["seconds"] for x in res[size, "ours"]]
        for impl, label in INFORMER_IMPLS.items():
            xs = res[size, impl]
            secs = [x["seconds"] for x in xs]
            print(
                f"| {size:,} | {label} | {spread(secs, 2)} | "
                f"{'' if impl == 'ours' else ratio(ours, secs)} | "
                f"{rss_cells(xs)} | {spread([x['p50'] for x in xs], 1, scale=1e3)} | "
                f"{spread([x['p99'] for x in xs], 1, scale=1e3)} |"
            )


def part_exec(kubeconfig: str, rounds: int, n: int) -> None:
    impls = {
        "ours": "ours, `exec_command` (negotiates v5)",
        "official-v5": "`kubernetes.aio.stream.WsApiClient`, v5",
        "official-v4": "`kubernetes.aio.stream.WsApiClient`, v4 (its default)",
    }
    res: dict[tuple[int, str], list[dict]] = {}
    for r in range(rounds + 1):
        for conc in (1, 10):
            for impl in ordered(list(impls), r):
                x = measure("exec", impl, kubeconfig, str(n), str(conc))
                assert x["wrong"] == 0, x
                print(
                    f"exec r{r} c{conc} {impl}: {x['total']:.2f} s, fds "
                    f"{x['fds_before']}->{x['fds_after']}",
                    flush=True,
                )
                if r:
                    res.setdefault((conc, impl), []).append(x)
    print(f"\nExec `cat small.txt` ({len(SMALL)} bytes, checked) x {n}; {rounds} rounds")
    print(
        "| at once | contender | total s | ours / this | per exec p50 ms "
        "| peak RSS MiB (after warm-up) | RSS growth MiB | open fds before → after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for conc in (1, 10):
        ours = [x["total"] for x in res[conc, "ours"]]
        for impl, label in impls.items():
            xs = res[conc, impl]
            tot = [x["total"] for x in xs]
            fds = f"{max(x['fds_before'] for x in xs)} → {max(x['fds_after'] for x in xs)}"
            print(
                f"| {conc} | {label} | {spread(tot, 2)} | "
                f"{'' if impl == 'ours' else ratio(ours, tot)} | "
                f"{spread([x['p50'] for x in xs], 1, scale=1e3)} | "
                f"{rss_cells(xs)} | {fds} (max) |"
            )
    print("\nWhat comes back:")
    for impl, label in impls.items():
        if impl == "official-v4":
            continue  # the same as v5
        for what, got in measure("exec-probe", impl, kubeconfig).items():
            print(f"- {label}, {what}: {got}")


LEADER_IMPLS = {
    "ours": "ours, `LeaderElector`",
    "official": "`kubernetes.aio.leaderelection` + LeaseLock",
}


def part_leader(cluster: Any, rounds: int, timing: tuple[float, float, float], window: float,
                tmp: Path, only: str | None) -> None:  # fmt: skip
    impls = {k: v for k, v in LEADER_IMPLS.items() if only in (None, k)}
    res: dict[str, list[dict]] = {}
    for r in range(rounds + 1):
        for impl in ordered(list(impls), r):
            x = asyncio.run(leader_round(cluster, impl, timing, window, tmp))
            print(
                f"leader r{r} {impl}: failover {x['failover']:.2f} s, old stopped "
                f"{x['old_stopped']:.2f} s, its elector gave up {x['old_gave_up']:.2f} s, "
                f"overlap {x['overlap']:+.2f} s, still acting "
                f"{x['still_acting']} after {x['window']:.0f} s; old: {x['old_events']}",
                flush=True,
            )
            if r:
                res.setdefault(impl, []).append(x)
    dur, renew, retry = timing
    print(
        f"\nLeader election, lease {dur:g} s / renew deadline {renew:g} s / retry {retry:g} s; "
        f"the leader's connection blackholed; {rounds} rounds, median [min{DASH}max], seconds "
        f"from the cut (overlap > 0: both acted at once)"
    )
    print(
        "| contender | failover | old leader's on_stopped_leading | old leader's last action "
        "| overlap | old leader's elector gave up | rounds with the old leader still acting "
        "at the end |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for impl, label in impls.items():
        xs = res[impl]

        def fmt(key: str, xs: list[dict] = xs) -> str:
            vals = [x[key] for x in xs if x[key] == x[key]]  # NaN: never happened
            if not vals:
                return "never"
            return spread(vals, 2) + ("" if len(vals) == len(xs) else f" ({len(vals)} rounds)")

        still = sum(x["still_acting"] for x in xs)
        watched = f" (watched {min(x['window'] for x in xs):.0f} s)" if still else ""
        overlap = fmt("overlap") + (" (lower bound)" if still else "")
        print(
            f"| {label} | {fmt('failover')} | {fmt('old_stopped')} | {fmt('old_last_act')} | "
            f"{overlap} | {fmt('old_gave_up')} | {still} of {len(xs)}{watched} |"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        run_child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="5000,20000")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds, after one warm-up")
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--lease", default="15,10,2", help="lease duration, renew deadline, retry (s)")
    ap.add_argument("--window", type=float, default=60, help="watch the old leader this long (s)")
    ap.add_argument("--parts", default="list,informer,exec,leader")
    ap.add_argument(
        "--leader-only", choices=sorted(LEADER_IMPLS), help="one contender (long windows)"
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    dur, renew, retry = (float(x) for x in args.lease.split(","))
    timing = (dur, renew, retry)

    from localcluster import LocalCluster

    cluster = LocalCluster(nodes=1)
    cluster.start()
    try:
        kubeconfig = str(cluster.kubeconfig)
        others = OthersCpu(cluster)
        sizes: dict[int, str] = {}
        if parts & {"list", "informer"}:
            for size in (int(s) for s in args.sizes.split(",")):
                sizes[size] = f"peers-{size}"
                took = asyncio.run(seed(kubeconfig, sizes[size], size))
                print(f"seeded {size} ConfigMaps in {took:.1f} s", flush=True)
            others.cores()  # from here on
        if "list" in parts:
            part_list(kubeconfig, sizes, args.rounds)
            print(f"others' CPU during list: {others.cores():.2f} cores of {os.cpu_count()}")
        if "informer" in parts:
            part_informer(kubeconfig, sizes, args.rounds, args.updates)
            print(f"others' CPU during informer: {others.cores():.2f} cores of {os.cpu_count()}")
        if "exec" in parts:
            setup_exec_pod(cluster)
            part_exec(kubeconfig, args.rounds, args.execs)
            print(f"others' CPU during exec: {others.cores():.2f} cores of {os.cpu_count()}")
        if "leader" in parts:
            assert cluster.workdir is not None
            part_leader(
                cluster, args.rounds, timing, args.window, cluster.workdir, args.leader_only
            )
            print(f"others' CPU during leader: {others.cores():.2f} cores of {os.cpu_count()}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
