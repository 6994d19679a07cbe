"""Two kubeckpt-reconciler processes with leader election on the real API server: only the
leader execs and writes; SIGKILL the leader (no Lease release): the other takes the Lease within
the lease duration plus retry periods of the last renewal, keeps the TrainingProgress following
the file, and sends no Event twice."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from progress_support import event_counts, progress, start_job, write_atomic

from localcluster import LocalCluster, free_port

SCRIPT = Path(sys.executable).parent / "kubeckpt-reconciler"
LEASE = "kubeckpt-reconciler"
LEASE_DURATION, RENEW_DEADLINE, RETRY = 4.0, 3.0, 0.5
JITTER = 0.1  # LeaderElectionConfig's default: acquisition retries wait up to 1.1 x RETRY
SLACK = 1.5  # a busy 2-core machine: the candidate's own loop may run late


def start(cluster: LocalCluster, ns: str, name: str, port: int, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                str(SCRIPT),
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--namespace",
                ns,
                "--bind-address",
                "127.0.0.1",
                "--port",
                "0",
                # Plain HTTP /metrics on `port`: this test reads the counters, not the auth
                # (tests/integration/progress/test_progress_rbac.py scrapes it securely).
                "--metrics-port",
                str(port),
                "--no-metrics-secure",
                "--poll-early",
                "1",
                "--poll-recent",
                "1",
                "--poll-stale",
                "1",
                "--early-window",
                "0",
                "--lease-duration",
                str(LEASE_DURATION),
                "--renew-deadline",
                str(RENEW_DEADLINE),
                "--retry-period",
                str(RETRY),
                "--trainjob-discovery-interval",
                "3600",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            # The Lease's holderIdentity starts with POD_NAME: which process leads.
            env={**os.environ, "POD_NAME": name, "LOG_LEVEL": "INFO"},
        )


def counters(port: int) -> dict[str, float]:
    """The controller's read/write counters from the process's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.finditer(r"^kubeckpt_progress_(\w+)_total (\S+)$", text, re.M)
    return {m[1]: float(m[2]) for m in found}


def wait(check, what: str, within: float, interval: float = 0.1) -> object:
    deadline = time.monotonic() + within
    while not (r := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        time.sleep(interval)
    return r


def lease(cluster: LocalCluster, ns: str) -> dict:
    p = cluster.kubectl("get", "lease", LEASE, "-n", ns, "-o", "json", check=False)
    return json.loads(p.stdout)["spec"] if p.returncode == 0 else {}


def micro(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def step(cluster: LocalCluster, ns: str, name: str) -> int | None:
    p = cluster.kubectl("get", "tp", name, "-n", ns, "-o", "json", check=False)
    return ((json.loads(p.stdout).get("status") or {}).get("step")) if p.returncode == 0 else None


def ck(n: int) -> dict:
    return {"enabled": True, "latestCheckpoint": f"/ckpt/checkpoint-{n}", "checkpointsCreated": n}


def test_sigkilled_leader_is_replaced_without_duplicate_events(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    path = start_job(cluster, ns, "ha", progress(1, checkpointing=ck(1)))
    names = ("r0", "r1")
    ports = {n: free_port() for n in names}
    procs = {n: start(cluster, ns, n, ports[n], tmp_path / f"{n}.log") for n in names}
    try:
        wait(lambda: step(cluster, ns, "ha") == 1, "the first record", 90)
        holder = str(lease(cluster, ns).get("holderIdentity") or "")
        leader = next(n for n in names if holder.startswith(f"{n}_"))
        other = next(n for n in names if n != leader)
        for s in (2, 3):
            write_atomic(path, progress(s, checkpointing=ck(s)))
            wait(lambda s=s: step(cluster, ns, "ha") == s, f"step {s}", 10)
        wait(lambda: event_counts(cluster, ns, "ha").get("CheckpointSaved") == 3, "3 events", 10)
        led, idle = counters(ports[leader]), counters(ports[other])
        assert led["reads"] >= 3 and led["writes"] >= 3, led
        assert idle == {"reads": 0, "writes": 0, "skipped_writes": 0, "annotation_writes": 0}, idle
        before = event_counts(cluster, ns, "ha")

        # SIGKILL: no release, the Lease must expire. Its last renewal is the one read now.
        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(10)
        last = lease(cluster, ns)
        assert last["holderIdentity"] == holder, last
        taken = wait(
            lambda: (lz := lease(cluster, ns)).get("holderIdentity", holder) != holder and lz,
            "the takeover",
            LEASE_DURATION + 10 * RETRY + 30,
        )
        assert str(taken["holderIdentity"]).startswith(f"{other}_"), taken
        # client-go's bound: the candidate saw the last renewal at most one retry after it was
        # made, and takes over at its first retry at least a lease duration after that; never
        # sooner than a lease duration after the renewal (the killed leader could still lead).
        gap = micro(taken["acquireTime"]) - micro(last["renewTime"])
        print(f"takeover {gap:.2f}s after the last renewal")
        assert LEASE_DURATION <= gap <= LEASE_DURATION + 2 * RETRY * (1 + JITTER) + SLACK, gap

        # The new leader follows the file; no Event again for what was already reported.
        write_atomic(path, progress(4, checkpointing=ck(3)))
        wait(lambda: step(cluster, ns, "ha") == 4, "step 4 via the new leader", 15)
        write_atomic(path, progress(5, checkpointing=ck(5)))
        wait(lambda: step(cluster, ns, "ha") == 5, "step 5 via the new leader", 10)
        wait(
            lambda: event_counts(cluster, ns, "ha").get("CheckpointSaved") == 4,
            "the new checkpoint's event",
            10,
        )
        took_over = counters(ports[other])
        assert took_over["reads"] >= 2 and took_over["writes"] >= 2, took_over
        after = event_counts(cluster, ns, "ha")
        assert after == {**before, "CheckpointSaved": before["CheckpointSaved"] + 1}, (
            before,
            after,
        )
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    for n in names:
        text = (tmp_path / f"{n}.log").read_text()
        assert "Traceback" not in text, text[-4000:]
    assert procs[other].returncode == 0, (tmp_path / f"{other}.log").read_text()[-4000:]
