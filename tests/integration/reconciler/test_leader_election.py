"""Two manager processes campaign for one Lease (client-go's defaults: 15 s lease, 10 s renew
deadline, 2 s retry). One leads at a time; a SIGKILLed leader is replaced a lease duration after
the last renewal the other saw, at its next retry (so within lease + 2 retries of the kill, as
client-go); a leader cut off from the API server stops writing before the other starts (shown by
the write logs); an orderly shutdown releases the Lease for an immediate takeover."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import eventually
from tcpproxy import TcpProxy

from localcluster import LocalCluster
from reconciler.client import Client
from reconciler.errors import NotFound
from reconciler.objects import parse_time
from reconciler.resources import CONFIGMAPS, LEASES

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
LEASE, RENEW_DEADLINE, RETRY = 15.0, 10.0, 2.0
RETRY_JITTERED = RETRY * 1.1  # LeaderElectionConfig.jitter
MICRO_TIME = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"


class Candidate:
    def __init__(self, tmp: Path, cluster: LocalCluster, ns: str, ident: str, server: str = ""):
        self.identity = ident
        self.write_log = tmp / f"{ident}.writes"
        self.stderr = tmp / f"{ident}.log"
        self.write_log.touch()
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'hack'}"}
        with self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "lease_manager.py"),
                    str(cluster.kubeconfig),
                    ns,
                    ident,
                    str(self.write_log),
                    server,
                ],
                stderr=err,
                stdout=subprocess.DEVNULL,
                env=env,
            )

    def writes(self) -> list[float]:
        return [float(line.split()[0]) for line in self.write_log.read_text().splitlines()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def log_tail(self) -> str:
        return f"--- {self.identity} ---\n" + "\n".join(
            self.stderr.read_text(errors="replace").splitlines()[-25:]
        )


async def holder(client: Client, ns: str) -> dict:
    try:
        return (await client.api(LEASES).get("lease-test", ns))["spec"]
    except NotFound:
        return {}


def assert_no_overlap(*candidates: Candidate) -> int:
    """Writes merged in time order form runs per writer; returns the number of handovers.
    Two writers interleaving would show as more runs than leadership terms."""
    merged = sorted((t, c.identity) for c in candidates for t in c.writes())
    return sum(1 for (_, a), (_, b) in itertools.pairwise(merged) if a != b)


@pytest.fixture
async def ticker(client: Client, namespace: str) -> str:
    await client.api(CONFIGMAPS).create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ticker", "namespace": namespace},
        }
    )
    return namespace


async def test_sigkilled_leader_is_replaced_a_lease_duration_after_its_last_renewal(
    cluster: LocalCluster, client: Client, ticker: str, tmp_path: Path
) -> None:
    ns = ticker
    a = Candidate(tmp_path, cluster, ns, "a")
    b: Candidate | None = None
    try:
        await eventually(lambda: bool(a.writes()), "a to lead and write", within=30)
        assert (await holder(client, ns))["holderIdentity"] == "a"
        b = Candidate(tmp_path, cluster, ns, "b")
        await asyncio.sleep(4)  # b is up and campaigning
        assert b.proc.poll() is None and b.writes() == [], "one leader at a time"
        a_writes = len(a.writes())
        assert a_writes > 5

        killed = time.monotonic()
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        last_renew = parse_time((await holder(client, ns))["renewTime"])  # a's last, in a's clock
        await eventually(lambda: bool(b.writes()), "b to take over", within=LEASE + 15)
        first_b = b.writes()[0]
        takeover = first_b - killed
        spec = await holder(client, ns)
        # b never takes the Lease sooner than a lease duration after a's last renewal (same
        # machine, so the two wall-clock stamps compare): it counts from when it *saw* that
        # renewal, which is at most one retry after it was made, then acquires at its next retry.
        handover = (parse_time(spec["acquireTime"]) - last_renew).total_seconds()
        # (Both stamps are taken before each side's requests, as client-go does: allow for those.)
        assert LEASE - 0.25 <= handover <= LEASE + 2 * RETRY_JITTERED + 0.5, handover
        # From the kill, which came at most one renewal period after a's last renewal:
        assert LEASE - RETRY - 0.5 < takeover <= LEASE + 2 * RETRY_JITTERED + 1.0, takeover
        assert max(a.writes()) < first_b
        assert spec["holderIdentity"] == "b"
        assert spec["leaseTransitions"] == 1
        assert spec["leaseDurationSeconds"] == int(LEASE)
        for key in ("acquireTime", "renewTime"):
            assert re.match(MICRO_TIME, spec[key]), spec[key]
        assert assert_no_overlap(a, b) == 1
    except AssertionError:
        print(a.log_tail(), b.log_tail() if b else "", sep="\n")
        raise
    finally:
        a.stop()
        if b is not None:
            b.stop()


async def test_partitioned_leader_stops_writing_before_the_other_starts(
    cluster: LocalCluster, client: Client, ticker: str, tmp_path: Path
) -> None:
    ns = ticker
    proxy = TcpProxy("127.0.0.1", int(cluster.server.rsplit(":", 1)[1]))
    port = await proxy.start()
    a = Candidate(tmp_path, cluster, ns, "a", server=f"https://127.0.0.1:{port}")
    b: Candidate | None = None
    try:
        await eventually(lambda: bool(a.writes()), "a to lead", within=30)
        b = Candidate(tmp_path, cluster, ns, "b")
        await asyncio.sleep(4)
        assert b.writes() == [] and (await holder(client, ns))["holderIdentity"] == "a"

        paused = time.monotonic()
        proxy.blackhole()  # a can no longer reach the API server; nothing tells it so
        await eventually(lambda: bool(b.writes()), "b to lead", within=LEASE + 20)
        last_a, first_b = max(a.writes()), b.writes()[0]
        # The old leader stopped writing within its renew deadline, before the new one started,
        # with the lease_duration - renew_deadline margin between them.
        assert last_a < first_b
        assert last_a - paused < RENEW_DEADLINE + 0.5, last_a - paused
        assert first_b - last_a > (LEASE - RENEW_DEADLINE) - RETRY, first_b - last_a
        assert first_b - paused <= LEASE + 2 * RETRY_JITTERED + 1.0
        assert a.proc.poll() is None, "a stopped leading but runs on, campaigning"
        assert "lost lease" in a.stderr.read_text()

        proxy.heal()
        await asyncio.sleep(4)
        assert max(a.writes()) == last_a, "a, reconnected, sees b's lease and stays a follower"
        assert (await holder(client, ns))["holderIdentity"] == "b"

        # An orderly shutdown releases the Lease: a takes over at once, not a lease later.
        terminated = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(b.proc.wait, 20) == 0
        await eventually(
            lambda: max(a.writes()) > terminated,
            "a to take the released lease",
            within=LEASE,
        )
        takeover = min(t for t in a.writes() if t > terminated) - terminated
        assert takeover < 1 + RETRY_JITTERED + 2, takeover
        spec = await holder(client, ns)
        assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 2
        assert assert_no_overlap(a, b) == 2
    except AssertionError:
        print(a.log_tail(), b.log_tail() if b else "", sep="\n")
        raise
    finally:
        a.stop()
        if b is not None:
            b.stop()
        await proxy.stop()
