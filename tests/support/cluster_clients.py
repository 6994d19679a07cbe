"""What the integration tests share to talk to the local control plane with our client."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from localcluster import LocalCluster
from reconciler.config import ClientConfig, load_kubeconfig


def admin_config(cluster: LocalCluster, **overrides: object) -> ClientConfig:
    """The cluster admin's client configuration, with no client-side rate limit."""
    cfg = load_kubeconfig(cluster.kubeconfig)
    cfg.qps = None  # tests drive the API server hard on purpose
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


async def eventually(
    check: Callable[[], Any | Awaitable[Any]], what: str, within: float, interval: float = 0.1
) -> Any:
    """Poll `check` (sync or async) until it returns something truthy, and return that; fail
    after `within` seconds. The async twin of localcluster's `wait_for`, for tests whose event
    loop runs the code under test."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(interval)
