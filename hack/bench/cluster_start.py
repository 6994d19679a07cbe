"""Warm start-up time of the local cluster (cached binaries and images), stage by stage.

Usage: python hack/bench/cluster_start.py [--runs N] [--real-node]   (make bench)
Prints each run's timings and the median. Targets: the control plane with KWOK nodes in 15 s or
less; with the real node (containerd, kubelet, kube-proxy, CoreDNS, images already imported) until
that node is Ready, in 30 s or less.
"""

from __future__ import annotations

import argparse
import statistics
import time

from localcluster import LocalCluster, ensure_binaries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--real-node", action="store_true", help="with the real node (needs root)")
    args = ap.parse_args()
    budget = 30 if args.real_node else 15
    binaries = ensure_binaries()
    starts, stops, apiservers = [], [], []
    for i in range(args.runs):
        c = LocalCluster(nodes=3, binaries=binaries, real_nodes=int(args.real_node))
        c.start()
        t0 = time.monotonic()
        c.stop()
        stops.append(time.monotonic() - t0)
        starts.append(c.timings["start"])
        apiservers.append(c.timings["apiserver_ready"])
        node = (
            f", real node Ready {c.timings['node_node_ready']:.2f} s after the control plane"
            if args.real_node
            else ""
        )
        print(
            f"run {i + 1}: start {c.timings['start']:.2f} s (kube-apiserver ready at "
            f"{c.timings['apiserver_ready']:.2f} s{node}), stop {stops[-1]:.2f} s",
            flush=True,
        )
    med = statistics.median(starts)
    print(
        f"median warm start {med:.2f} s over {args.runs} runs "
        f"(kube-apiserver ready {statistics.median(apiservers):.2f} s, "
        f"stop {statistics.median(stops):.2f} s); target <= {budget} s: "
        f"{'met' if med <= budget else 'NOT met'} (ratio {med / budget:.2f} of the budget)"
    )


if __name__ == "__main__":
    main()
