"""Polling with a deadline, for tests and scripts that wait on the cluster."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None], what: str, timeout: float = 60, interval: float = 0.2
) -> T:
    """Call `check` until it returns a truthy value and return that value; raise on timeout.

    Exceptions from `check` count as "not yet"; the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except Exception as e:
            last = e
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
