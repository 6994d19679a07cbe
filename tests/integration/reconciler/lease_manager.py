"""A manager with leader election, run as a process by test_leader_election.py.

While leading, its controller rewrites one ConfigMap about five times a second; before each write
it appends "<monotonic time> <identity>" to its write log, so the test can check that two
managers never wrote in overlapping periods. SIGTERM stops it in order (releasing the Lease).

Usage: python lease_manager.py KUBECONFIG NAMESPACE IDENTITY WRITE_LOG [SERVER]
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

from reconciler import (
    Client,
    LeaderElectionConfig,
    Manager,
    Request,
    Result,
    install_signal_handlers,
    load_kubeconfig,
)
from reconciler.errors import NotFound
from reconciler.resources import CONFIGMAPS

TICKER = "ticker"


async def main(kubeconfig: str, namespace: str, identity: str, log_path: str, server: str) -> None:
    cfg = load_kubeconfig(kubeconfig)
    if server:
        cfg.server = server
    cfg.timeout = 5.0
    client = Client(cfg)
    cms = client.api(CONFIGMAPS)
    manager = Manager(
        client,
        name=identity,
        port=0,
        leader_election=LeaderElectionConfig("lease-test", namespace, identity=identity),
        drain_timeout=2.0,
    )
    informer = manager.informer(cms, namespace=namespace, field_selector=f"metadata.name={TICKER}")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    writes = 0

    async def reconcile(req: Request) -> Result:
        nonlocal writes
        writes += 1
        # One write(2) per line: the log survives a SIGKILL at any point.
        os.write(log_fd, f"{time.monotonic():.6f} {identity}\n".encode())
        try:
            await cms.patch(req.name, {"data": {"writer": identity, "n": str(writes)}}, namespace)
        except NotFound:
            pass
        return Result(requeue_after=0.2)

    controller = manager.controller("ticker", reconcile)
    # Our own writes come back as updates: ignore them, the requeue_after sets the pace.
    controller.watch(informer, update_predicate=lambda _old, _new: False)
    install_signal_handlers(manager)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {identity} %(name)s %(message)s", stream=sys.stderr
    )
    try:
        await manager.run()
    finally:
        await client.close()
        os.close(log_fd)


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(main(*args[:4], args[4] if len(args) > 4 else ""))
