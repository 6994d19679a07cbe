"""The demo's training container: a tiny PyTorch model trained with kubeckpt's CheckpointManager,
on one process or on several with DDP over gloo (started by torchrun, one process per pod).

Everything about checkpoints comes from the environment the webhook injected (CHECKPOINT_URI,
strategy, JIT, progress file, ...): the script only adopts the runtime's three calls (`from_env`,
`restore`, `step_end`). It prints a few lines for the demo, and writes `exit.json` (step reached,
whether it stopped for a just-in-time checkpoint, what it resumed from, and at the end a SHA-256
of the final parameters, so that a preempted run can be compared with an uninterrupted one) in
its working directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer_runtime.torch import CheckpointManager, ResumableSampler

RANK = int(os.environ.get("RANK", "0"))


def say(msg: str) -> None:
    print(f"[rank {RANK}] {msg}" if "WORLD_SIZE" in os.environ else msg, flush=True)


def digest(model: nn.Module) -> str:
    """SHA-256 of the parameters and buffers, in order: equal only if bitwise equal."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-seconds", type=float, default=0.1, help="least time per step")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)  # a small model: threads only add contention on a shared machine
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 32, generator=gen)
    y = (x[:, :4].sum(dim=1) > 0).long() + (x[:, 4:8].sum(dim=1) > 0).long()  # 3 classes
    dataset = TensorDataset(x, y)
    sampler = ResumableSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=2)
    # A generator of its own: a resumed run then draws nothing from the global RNG out of turn.
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, generator=torch.Generator())
    model: nn.Module = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 3))
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    loss_fn = nn.CrossEntropyLoss()

    mgr = CheckpointManager.from_env(
        model, optimizer, scheduler=scheduler, sampler=sampler, total_steps=args.steps
    )
    step = mgr.restore()
    if mgr.resumed_from:
        say(f"train: resumed from {mgr.resumed_from} at step {step}")
    else:
        say(f"train: no checkpoint under {os.environ.get('CHECKPOINT_URI')}; starting at step 0")
    stopped = False
    epoch = sampler.epoch
    while step < args.steps and not stopped:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            t0 = time.monotonic()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            time.sleep(max(0.0, args.step_seconds - (time.monotonic() - t0)))
            if mgr.step_end(step, epoch=epoch, loss=loss.detach()):
                stopped = True  # a just-in-time checkpoint was taken: exit cleanly
                break
            if step >= args.steps:
                break
        else:
            epoch += 1
    mgr.close()
    info: dict[str, object] = {"step": step, "stopped": stopped, "resumed_from": mgr.resumed_from}
    if stopped:
        # Not 0: the operator would take a preempted master's success for the job's (see
        # trainer_runtime.contract.PREEMPTED_EXIT_CODE) and never restart it.
        code = mgr.exit_code
        say(f"train: stopped at step {step} after a just-in-time checkpoint; exiting {code}")
    else:
        info["sha256"] = digest(model.module if world > 1 else model)
        say(f"train: finished at step {step} (loss {loss.item():.4f})")
        say(f"train: final parameters sha256 {info['sha256']}")
    Path("exit.json").write_text(json.dumps(info))
    if world > 1:
        dist.barrier()  # no rank tears the group down under another's last collective
        dist.destroy_process_group()
    return mgr.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
