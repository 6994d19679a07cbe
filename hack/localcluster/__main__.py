"""`python -m localcluster up|start|stop|status` (run with hack/ on sys.path; see the Makefile).

up     run the cluster in the foreground until SIGINT/SIGTERM (with Kubeflow Trainer and JobSet
       when it has a real node; --trainer off|on|status, status = Trainer's TrainJobStatus gate on;
       --kueue: with Kueue, PyTorchJob and TrainJob integrations and PriorityBoost on;
       --s3: with SeaweedFS's S3 gateway on the real node's address, for s3:// storage)
start  run it in the background and return once it is ready (state in .cluster/)
stop   stop a cluster started with `start`
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .cluster import REPO, LocalCluster
from .node import host_problem

STATE = REPO / ".cluster"


def _up(
    nodes: int,
    real_nodes: int | None,
    state: Path | None,
    trainer: str | None,
    kueue: bool,
    s3: bool = False,
) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if real_nodes is None:
        problem = host_problem()
        real_nodes = 0 if problem else 1
        if problem:
            print(f"KWOK nodes only: {problem}", file=sys.stderr)
    # Workloads go to the real node, where containers run; KWOK nodes stay for scale tests.
    cluster = LocalCluster(nodes=nodes, real_nodes=real_nodes, taint_kwok_nodes=bool(real_nodes))
    cluster.start()
    try:
        if (trainer or ("on" if real_nodes else "off")) != "off":
            cluster.start_trainer(status_gate=trainer == "status")
        if kueue:
            cluster.start_kueue()
        if s3:
            server = cluster.start_seaweedfs()
            print(
                f"S3 (SeaweedFS) at {server.endpoint} for pods; its access key and secret: "
                f"{server.workdir / 's3.json'}"
            )
        info = cluster.describe()
        if state is not None:
            state.mkdir(exist_ok=True)
            (state / "kubeconfig").write_text(cluster.kubeconfig.read_text())
            (state / "cluster.json").write_text(json.dumps({**info, "pid": os.getpid()}, indent=2))
        print(f"cluster ready in {info['timings']['start']} s")  # type: ignore[index]
        print(f"export KUBECONFIG={state / 'kubeconfig' if state else cluster.kubeconfig}")
        sys.stdout.flush()
        while not stop.wait(1):
            for p in cluster.procs.values():
                if not p.alive():
                    print(f"{p.name} exited:\n{p.tail()}", file=sys.stderr)
                    return 1
        return 0
    finally:
        cluster.stop()
        if state is not None:
            for f in ("kubeconfig", "cluster.json"):
                (state / f).unlink(missing_ok=True)


def _start(
    nodes: int, real_nodes: int | None, trainer: str | None, kueue: bool, s3: bool = False
) -> int:
    STATE.mkdir(exist_ok=True)
    info = STATE / "cluster.json"
    if info.exists():
        pid = json.loads(info.read_text()).get("pid")
        if pid and Path(f"/proc/{pid}").exists():
            print(f"already running (pid {pid}); export KUBECONFIG={STATE / 'kubeconfig'}")
            return 0
        info.unlink()
    log = (STATE / "cluster.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localcluster",
            "up",
            "--nodes",
            str(nodes),
            *(["--real-nodes", str(real_nodes)] if real_nodes is not None else []),
            *(["--trainer", trainer] if trainer is not None else []),
            *(["--kueue"] if kueue else []),
            *(["--s3"] if s3 else []),
            "--state",
            str(STATE),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=os.environ,
    )
    while not info.exists():
        if proc.poll() is not None:
            print((STATE / "cluster.log").read_text()[-4000:], file=sys.stderr)
            print("the local cluster failed to start; its log is above", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"cluster running (pid {proc.pid}); export KUBECONFIG={STATE / 'kubeconfig'}")
    return 0


def _stop() -> int:
    info = STATE / "cluster.json"
    if not info.exists():
        print("no local cluster is running")
        return 0
    pid = json.loads(info.read_text())["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        info.unlink(missing_ok=True)
        return 0
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    print("cluster stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="localcluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=["up", "start", "stop"])
    ap.add_argument("--nodes", type=int, default=3, help="KWOK nodes")
    ap.add_argument(
        "--real-nodes",
        type=int,
        choices=[0, 1, 2],
        default=None,
        help="real nodes (containerd + kubelet each); default 1 where the machine can run one; "
        "2 adds a second node with its own pod subnet (its first start imports the images, about "
        "a minute)",
    )
    ap.add_argument(
        "--trainer",
        choices=["off", "on", "status"],
        default=None,
        help="Kubeflow Trainer and JobSet (default: on with a real node); status: with Trainer's "
        "TrainJobStatus feature gate",
    )
    ap.add_argument(
        "--kueue",
        action="store_true",
        help="Kueue (built by hack/build-binaries.sh; needs root), with the PyTorchJob and "
        "TrainJob integrations and its PriorityBoost feature gate",
    )
    ap.add_argument(
        "--s3",
        action="store_true",
        help="SeaweedFS's S3 gateway (built by hack/build-binaries.sh; needs the real node), "
        "reachable from pods at the node's address",
    )
    ap.add_argument("--state", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.command == "up":
        return _up(args.nodes, args.real_nodes, args.state, args.trainer, args.kueue, args.s3)
    if args.command == "start":
        return _start(args.nodes, args.real_nodes, args.trainer, args.kueue, args.s3)
    return _stop()


if __name__ == "__main__":
    sys.exit(main())
