"""A small, fully deterministic training job for the runtime tests (single process or torchrun).

Everything that can make a resumed run differ from an uninterrupted one is in it: dropout (RNG),
BatchNorm (buffers), Adam (optimizer state), an LR schedule, a GradScaler, a shuffled sampler
part-way through an epoch, and DDP when there are several ranks. Each rank reports its step in
`<status-dir>/status-<rank>.json` (for the harness to pick a moment), and writes its final model,
optimizer and RNG state to `<status-dir>/final-<rank>.pt` when it reaches the last step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.utils.data import DataLoader, TensorDataset

from trainer_runtime.torch import CheckpointManager, ResumableSampler


def build_model(width: int) -> nn.Module:
    torch.manual_seed(1234)  # the same initial weights on every rank and every run
    return nn.Sequential(
        nn.Linear(16, width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 4),
    )


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def evaluate(model: nn.Module, x: torch.Tensor, seconds: float) -> None:
    """A long evaluation: forward passes, no step boundary, no random numbers drawn."""
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    module.eval()
    deadline = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < deadline:
            module(x[:64])
            time.sleep(0.01)
    module.train()


def _process_groups() -> int:
    """How many process groups torch holds (its registry: no public count exists)."""
    if not dist.is_initialized():
        return 0
    return len(dist.distributed_c10d._world.pg_map)


def train(
    *,
    steps: int,
    status_dir: Path,
    environ: dict[str, str] | None = None,
    sleep: float = 0.0,
    width: int = 64,
    samples: int = 512,
    batch: int = 16,
    fsdp: bool = False,
    eval_at: int = 0,
    eval_seconds: float = 0.0,
    warmup_seconds: float = 0.0,
    workers: int = 0,
    crash_at: int = 0,
) -> dict:
    """One run: resume if there is a checkpoint, train to `steps` or until told to stop."""
    status_dir.mkdir(parents=True, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0

    gen = torch.Generator().manual_seed(99)
    x = torch.randn(samples, 16, generator=gen)
    y = torch.randint(0, 4, (samples,), generator=gen)
    dataset = TensorDataset(x, y)
    sampler = ResumableSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=7)
    # A loader generator of its own: creating an iterator then draws nothing from the global RNG,
    # which a resumed run would otherwise draw at a different moment than the original.
    loader = DataLoader(
        dataset,
        batch_size=batch,
        sampler=sampler,
        generator=torch.Generator(),
        num_workers=workers,
    )

    model = build_model(width)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear | nn.BatchNorm1d):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu")
    torch.manual_seed(100 + rank)  # per-rank dropout streams, as in real data-parallel jobs

    groups_before = _process_groups()
    mgr = CheckpointManager.from_env(
        model,
        optimizer,
        scheduler=scheduler,
        scaler=scaler,
        sampler=sampler,
        total_steps=steps,
        environ=environ,
    )
    step = mgr.restore()
    write_json(status_dir / f"status-{rank}.json", {"pid": os.getpid(), "step": step})
    if warmup_seconds:  # a first compile, a cache warm-up: long, and no step boundary
        write_json(status_dir / f"warmup-{rank}.json", {"pid": os.getpid(), "step": step})
        time.sleep(warmup_seconds)
    epoch = sampler.epoch
    stopped = False
    loss_fn = nn.CrossEntropyLoss()
    # `with`: a rank that raises leaves at once; the others are stopped by torchrun.
    with mgr:
        while step < steps and not stopped:
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(xb), yb)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                step += 1
                if sleep:
                    time.sleep(sleep)
                if step == crash_at and rank == 1:
                    raise RuntimeError(f"injected: rank 1 fails at step {step}")
                if mgr.step_end(step, epoch=epoch, loss=loss.detach()):
                    stopped = True
                    break
                write_json(status_dir / f"status-{rank}.json", {"pid": os.getpid(), "step": step})
                if step == eval_at:
                    write_json(status_dir / f"eval-{rank}.json", {"pid": os.getpid(), "step": step})
                    evaluate(model, x, eval_seconds)
                if step >= steps:
                    break
            else:
                epoch += 1
    info = {
        # close destroys the manager's own groups (their gloo threads would otherwise outlive it
        # into interpreter exit, where they can abort the process)
        "groups_left_by_close": _process_groups() - groups_before,
        "step": step,
        "stopped": stopped,
        "resumed_from": mgr.resumed_from,
        "resumed_tier": mgr.resumed_tier,
        "failed_saves": mgr.failed_saves,
        "last_error": mgr.last_error,
    }
    write_json(status_dir / f"exit-{rank}.json", info)
    if step >= steps and not stopped:
        if fsdp:  # gathered: each rank's shards alone would not say much
            full = StateDictOptions(
                full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False
            )
            model_state, optim_state = get_state_dict(model, optimizer, options=full)
            model_state = {**model_state, **{n: b for n, b in model.named_buffers()}}
        else:
            module = model.module if world > 1 else model
            model_state, optim_state = module.state_dict(), optimizer.state_dict()
        torch.save(
            {
                "model": model_state,
                "optim": optim_state,
                "rng": torch.get_rng_state(),
                "scaler": scaler.state_dict(),
                "sampler": sampler.state_dict(),
            },
            status_dir / f"final-{rank}.pt",
        )
    return info


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--status-dir", required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    parser.add_argument("--eval-at", type=int, default=0, help="evaluate after this step")
    parser.add_argument("--eval-seconds", type=float, default=0.0)
    parser.add_argument("--warmup-seconds", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--crash-at", type=int, default=0, help="rank 1 raises after this step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train(
        steps=args.steps,
        status_dir=Path(args.status_dir),
        sleep=args.sleep,
        width=args.width,
        fsdp=args.fsdp,
        eval_at=args.eval_at,
        eval_seconds=args.eval_seconds,
        warmup_seconds=args.warmup_seconds,
        workers=args.workers,
        crash_at=args.crash_at,
    )
    if dist.is_initialized():
        dist.barrier()  # no rank tears its group down under another's last collective
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
