"""trainer_runtime async-save stall on a GPU: pinned device-to-host staging vs the link's bandwidth.

Usage: python hack/bench/runtime_gpu_stall.py [--gib 2] [--dir DIR] [--reps 3]

Needs a CUDA device; without one it says so and exits with status 2 (nothing is measured).
With >= 1 GiB of model + Adam state on the GPU, in one run:
  - the link: one large device-to-host copy into pinned memory (GB/s), the baseline;
  - staging as the runtime does it (Stager, pinned buffers reused, a side stream): the bandwidth it
    reaches against the link's;
  - a synchronous save (async off: stage, write, fsync, hash, manifest) against the stall of an
    asynchronous one inside a training loop (step_end, plus any wait in the next optimizer.step(),
    which on CUDA is a stream wait, not a host block). Target: stall <= 4% of the sync save.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="model + Adam state on the GPU, GiB")
    ap.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(
            "runtime_gpu_stall: no CUDA device (torch.cuda.is_available() is False): "
            "nothing measured. Run it on a machine with an NVIDIA GPU."
        )
        return 2

    from trainer_runtime.torch import CheckpointManager
    from trainer_runtime.torch.staging import Stager

    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}")
    width = 8192
    layers = max(1, round(args.gib * 1024**3 / (3 * 4 * (width * width + width))))
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(dev)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(64, width, device=dev)).square().mean().backward()
        optimizer.step()

    train_step()
    torch.cuda.synchronize()
    state_bytes = sum(p.numel() * 4 * 3 for p in model.parameters())
    print(f"state: {state_bytes / 1024**3:.2f} GiB on the GPU")

    # The link: one big pinned copy.
    src = torch.empty(state_bytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty(src.shape, dtype=torch.float32, pin_memory=True)
    link = []
    for _ in range(args.reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        link.append(state_bytes / (time.perf_counter() - t0))
    del src, dst
    link_bw = statistics.median(link)
    print(f"link: pinned device-to-host {link_bw / 1e9:.1f} GB/s")

    # Staging as the runtime does it (buffers reused after the first round).
    from torch.distributed.checkpoint.state_dict import get_state_dict

    stager = Stager()
    stage_bw = []
    for _ in range(args.reps + 1):
        msd, osd = get_state_dict(model, optimizer)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        staged = stager.stage({"model": msd, "optim": osd}, late=lambda t: True)
        staged.wait()
        stage_bw.append(state_bytes / (time.perf_counter() - t0))
    stage = statistics.median(stage_bw[1:])
    print(f"staging: {stage / 1e9:.1f} GB/s = {100 * stage / link_bw:.0f}% of the link")

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="kubeckpt-gpu-bench-"))
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(base / "persistent"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": str(10**9),
        "CHECKPOINT_MAX_CHECKPOINTS": "1",
        "CHECKPOINT_JIT": "false",
        "TRAINING_PROGRESS_FILE": str(base / "progress.json"),
        "KUBECKPT_TERMINATION_LOG": str(base / "termination-log"),
    }
    sync_s = []
    mgr = CheckpointManager.from_env(model, optimizer, environ=env, async_save=False)
    for rep in range(args.reps):
        t0 = time.perf_counter()
        result = mgr.save(rep + 1)
        sync_s.append(time.perf_counter() - t0)
        assert result is not None and result.ok, result
    mgr.close()
    mgr = CheckpointManager.from_env(model, optimizer, environ=env)
    stalls = []
    for rep in range(args.reps + 1):
        mgr.save(100 + rep, blocking=False)
        train_step()
        torch.cuda.synchronize()
        result = mgr.wait()
        assert result is not None and result.ok, result
        stalls.append(result.stall_seconds)
    mgr.close()
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    sync = statistics.median(sync_s)
    stall = statistics.median(stalls[1:])
    print(f"sync save {sync:.2f} s; first async stall (allocates pinned buffers) {stalls[0]:.3f} s")
    print(
        f"async stall {stall * 1000:.1f} ms = {100 * stall / sync:.2f}% of the sync save "
        "(target <= 4%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
