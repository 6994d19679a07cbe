"""Rate budgets sized from the fleet the controller must keep fresh, not a fixed 20 QPS.

Each poll of a job is one exec and at most one status write, so a fleet of `jobs` polled every
`interval` seconds needs jobs / interval of each. The two go to separate budgets because the API
server treats them differently:

- A status write (PATCH) is a short request that API priority-and-fairness (APF) admits into the
  controller's priority level; when that level is full the server answers 429 with Retry-After.
  Its budget is a ceiling the client lowers on 429s and recovers from (reconciler.ratelimit
  .AimdRate), so a high default cannot keep pressing a server that is shedding load.
- An exec is a long-running request (a websocket to the node's exec stream): APF serves those
  outside its seats, so the server's fairness does not bound it. Its cost is a stream and a
  process on the node for as long as the read takes, so its budget is a rate plus a concurrency
  (rate x the time one read takes, the in-flight count Little's law gives).

`headroom` covers the jitter (intervals up to +10 %), retries, re-polls after a Busy and the
catch-up after a burst; the measured figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_FLEET = 1000  # jobs the defaults keep fresh at the shortest interval
DEFAULT_READ_SECONDS = 0.3  # one exec read, handshake to close (measured on KWOK: 0.1-0.5 s)
DEFAULT_HEADROOM = 1.5


class BudgetError(ValueError):
    """A sizing input out of range."""


@dataclass(frozen=True)
class Budgets:
    exec_qps: float
    exec_burst: int
    max_concurrent_execs: int
    write_qps: float  # the ceiling of the client that writes status (adaptive on 429s)
    write_burst: int


def size_budgets(
    jobs: int = DEFAULT_FLEET,
    interval: float = 15.0,
    *,
    read_seconds: float = DEFAULT_READ_SECONDS,
    headroom: float = DEFAULT_HEADROOM,
) -> Budgets:
    """Budgets that poll `jobs` jobs every `interval` seconds with `headroom` to spare."""
    if jobs < 1:
        raise BudgetError(f"jobs must be at least 1, got {jobs}")
    if not interval > 0 or not read_seconds > 0 or not headroom >= 1:
        raise BudgetError(
            f"need interval > 0, read_seconds > 0 and headroom >= 1, got {interval}, "
            f"{read_seconds}, {headroom}"
        )
    # Never below client-go's 20 QPS: a small fleet keeps the old behaviour.
    rate = max(20.0, math.ceil(headroom * jobs / interval))
    concurrency = max(10, math.ceil(rate * read_seconds))
    return Budgets(
        exec_qps=rate,
        exec_burst=max(20, math.ceil(rate / 2)),
        max_concurrent_execs=concurrency,
        # Status writes, Events and the creates of new TrainingProgresses share this client.
        write_qps=rate,
        write_burst=max(30, math.ceil(rate * 1.5)),
    )
