"""`make demo`: a local control plane, a PyTorchJob on it, and what kubectl shows.

Today the demo shows the foundation: the real training-operator turns an unchanged PyTorchJob into
pods that the real scheduler binds to KWOK nodes. Later steps (the webhook's injection, a real
training run, a preemption, a resume, progress in `kubectl get tp`) extend this script.
Pass --keep to leave the cluster running until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from localcluster import LocalCluster, wait_for

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "demo"


def show(cluster: LocalCluster, *args: str) -> str:
    print(f"\n$ kubectl {shlex.join(args)}", flush=True)
    out = cluster.kubectl(*args).stdout
    print(out.rstrip(), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keep", action="store_true", help="keep the cluster until Ctrl-C")
    args = ap.parse_args()
    print(
        "== starting the local control plane (etcd, kube-apiserver, controller-manager, "
        "scheduler, KWOK, training-operator)",
        flush=True,
    )
    with LocalCluster(nodes=3) as cluster:
        print(f"   ready in {cluster.timings['start']:.1f} s; KUBECONFIG={cluster.kubeconfig}")
        show(cluster, "get", "nodes", "-o", "wide")
        cluster.kubectl("create", "namespace", NAMESPACE)
        manifest = REPO / "hack" / "manifests" / "pytorchjob-mnist.yaml"
        print(f"\n== an unchanged PyTorchJob ({manifest.relative_to(REPO)})", flush=True)
        show(cluster, "apply", "-n", NAMESPACE, "-f", str(manifest))

        def running() -> bool:
            pods = json.loads(
                cluster.kubectl(
                    "get",
                    "pods",
                    "-n",
                    NAMESPACE,
                    "-l",
                    "training.kubeflow.org/job-name",
                    "-o",
                    "json",
                ).stdout
            )["items"]
            return len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods)

        t0 = time.monotonic()
        wait_for(running, "the job's pods to run", timeout=90)
        print(
            f"\n== the training-operator made the pods; they run after "
            f"{time.monotonic() - t0:.1f} s",
            flush=True,
        )
        show(cluster, "get", "pytorchjobs,pods", "-n", NAMESPACE, "-o", "wide")
        show(cluster, "describe", "pytorchjob", "pytorch-mnist", "-n", NAMESPACE)
        show(cluster, "api-resources", "--api-group=kubeckpt.io")
        if args.keep:
            print(f"\nexport KUBECONFIG={cluster.kubeconfig}   (Ctrl-C stops the cluster)")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    print("\n== cluster stopped, every process and temporary file removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
