"""Cost of trainer_runtime's per-step cross-rank agreement (2 ranks, gloo, loopback).

Usage: python hack/bench/runtime_agreement.py [--calls 3000]
(launches itself under torchrun with 2 processes; run it directly.)

Measures, on rank 0: a blocking all_reduce of the agreement's size (what an unpipelined check would
cost), then the time spent inside `step_end()` (signal flag, one stat() of the preStop request
file, the pipelined all_reduce, the progress check) in a loop of 100 ms steps. The steps sleep, as
a GPU step leaves the host idle; two ranks busy on two cores would measure the CPU scheduler.
Target (issue 5): at most 1% of a 100 ms training step, i.e. 1 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_SECONDS = 0.100


def launch(argv: list[str]) -> int:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        "--master_port=29533",
        __file__,
        *argv,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.call(cmd, env=env)


def percentiles(samples: list[float]) -> str:
    qs = statistics.quantiles(samples, n=100)
    return (
        f"median {statistics.median(samples) * 1e6:.0f} us, p99 {qs[98] * 1e6:.0f} us, "
        f"mean {statistics.fmean(samples) * 1e6:.0f} us"
    )


def worker(calls: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from trainer_runtime.torch import CheckpointManager
    from trainer_runtime.torch.agreement import Collectives

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    comm = Collectives.create()
    for _ in range(200):
        comm.all_max([0, 0, 0])
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        comm.all_max([0, 0, 0])
        samples.append(time.perf_counter() - t0)

    tmp = Path(tempfile.mkdtemp(prefix="kubeckpt-agree-"))
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(tmp / "ckpt"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": str(10**9),
        "CHECKPOINT_CONTROL_DIR": str(tmp / "control"),
        "TRAINING_PROGRESS_FILE": str(tmp / "progress.json"),
        "PROGRESS_UPDATE_FREQUENCY": str(10**9),
        "KUBECKPT_TERMINATION_LOG": str(tmp / "termination-log"),
    }
    model = nn.Linear(4, 4)
    mgr = CheckpointManager.from_env(model, torch.optim.SGD(model.parameters()), environ=env)
    for s in range(1, 21):
        mgr.step_end(s)
    step_samples = []
    for s in range(21, 21 + steps):
        time.sleep(STEP_SECONDS)
        t0 = time.perf_counter()
        mgr.step_end(s)
        step_samples.append(time.perf_counter() - t0)
    mgr.close()
    if rank == 0:
        allreduce = statistics.median(samples)
        mean = statistics.fmean(step_samples)
        print(f"blocking all_reduce(MAX), 3 int64, gloo, {calls} calls: {percentiles(samples)}")
        print(f"step_end() in {steps} steps of 100 ms, nothing due: {percentiles(step_samples)}")
        print(
            f"per-step cost {mean * 1e3:.3f} ms (mean) = {100 * mean / STEP_SECONDS:.3f}% of a "
            f"100 ms step (target <= 1%); a blocking all_reduce instead would be "
            f"{100 * statistics.fmean(samples) / STEP_SECONDS:.3f}% (mean), "
            f"{100 * allreduce / STEP_SECONDS:.3f}% (median)"
        )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000, help="blocking all_reduce calls")
    ap.add_argument("--steps", type=int, default=200, help="100 ms steps through step_end()")
    args = ap.parse_args()
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit(launch(sys.argv[1:]))
    worker(args.calls, args.steps)


if __name__ == "__main__":
    main()
