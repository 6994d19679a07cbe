"""Warm start-up time of the local control plane (cached binaries), stage by stage.

Usage: python hack/bench/cluster_start.py [--runs N]   (make bench)
Prints each run's timings and the median; the target is a warm start in 15 s or less.
"""

from __future__ import annotations

import argparse
import statistics
import time

from localcluster import LocalCluster, ensure_binaries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    binaries = ensure_binaries()
    starts, stops, apiservers = [], [], []
    for i in range(args.runs):
        c = LocalCluster(nodes=3, binaries=binaries)
        c.start()
        t0 = time.monotonic()
        c.stop()
        stops.append(time.monotonic() - t0)
        starts.append(c.timings["start"])
        apiservers.append(c.timings["apiserver_ready"])
        print(
            f"run {i + 1}: start {c.timings['start']:.2f} s (kube-apiserver ready at "
            f"{c.timings['apiserver_ready']:.2f} s), stop {stops[-1]:.2f} s",
            flush=True,
        )
    med = statistics.median(starts)
    print(
        f"median warm start {med:.2f} s over {args.runs} runs "
        f"(kube-apiserver ready {statistics.median(apiservers):.2f} s, "
        f"stop {statistics.median(stops):.2f} s); target <= 15 s: "
        f"{'met' if med <= 15 else 'NOT met'} (ratio {med / 15:.2f} of the budget)"
    )


if __name__ == "__main__":
    main()
