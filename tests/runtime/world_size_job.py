"""The job of test_world_size.py: train_job.py's deterministic DDP job, which also records which
samples every step consumed and the state right after the restore.

Each rank writes `<status-dir>/restored-<rank>.pt` (step, epoch, model, optimizer, scheduler,
scaler and sampler state as `mgr.restore()` left them) and, at the last step,
`<status-dir>/final-<rank>.pt` (the same at the end, plus `batches`: (step, epoch, sample ids) of
every step this run took). Single process without torchrun (WORLD_SIZE unset), or under torchrun.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer_runtime.torch import CheckpointManager, ResumableSampler

SAMPLES = 500
BATCH = 16
SEED = 7


def build_model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)
    )


def snapshot(module: nn.Module, optimizer, scheduler, scaler, sampler) -> dict:
    return {
        "model": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "optim": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "sampler": sampler.state_dict(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--status-dir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    status = Path(args.status_dir)
    status.mkdir(parents=True, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0

    gen = torch.Generator().manual_seed(99)
    x = torch.randn(SAMPLES, 16, generator=gen)
    y = torch.randint(0, 4, (SAMPLES,), generator=gen)
    dataset = TensorDataset(x, y, torch.arange(SAMPLES))
    sampler = ResumableSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())

    module = build_model()
    model = nn.parallel.DistributedDataParallel(module) if world > 1 else module
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(100 + rank)

    mgr = CheckpointManager.from_env(
        model,
        optimizer,
        scheduler=scheduler,
        scaler=scaler,
        sampler=sampler,
        total_steps=args.steps,
    )
    step = mgr.restore()
    restored = snapshot(module, optimizer, scheduler, scaler, sampler)
    torch.save(
        {"step": step, "epoch": sampler.epoch, "resumed_from": mgr.resumed_from, **restored},
        status / f"restored-{rank}.pt",
    )
    batches: list[tuple[int, int, list[int]]] = []
    epoch = sampler.epoch
    loss_fn = nn.CrossEntropyLoss()
    while step < args.steps:
        sampler.set_epoch(epoch)  # the restored epoch keeps its (mapped) position
        for xb, yb, ids in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            batches.append((step, epoch, ids.tolist()))
            mgr.step_end(step, epoch=epoch, loss=loss.detach())
            if step >= args.steps:
                break
        else:
            epoch += 1
    mgr.close()
    final = snapshot(module, optimizer, scheduler, scaler, sampler)
    torch.save(
        {"step": step, "epoch": epoch, "batches": batches, **final}, status / f"final-{rank}.pt"
    )
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
