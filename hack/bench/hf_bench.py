"""HF Trainer integration benchmark (CPU): the callback's overhead and the stall of a checkpoint.

Usage: python hack/bench/hf_bench.py [--reps 3] [--steps 40] [--save-every 10] [--dir DIR]

A GPT-2 built from a config (23M parameters, so a checkpoint with Adam's state is ~0.28 GB)
trains on random token ids in-process; the runs of each kind alternate (the order rotating from
one rep to the next), `--reps` times:

  plain        Trainer, no kubeckpt, no saves
  kubeckpt     the same with kubeckpt_trainer (progress file every 5 steps, per-step agreement),
               checkpoints enabled but none due (time strategy, 1 h)
  hf-save      plain Trainer, its own synchronous saves every `--save-every` steps
  ours-async   kubeckpt, async saves at the same steps
  ours-sync    kubeckpt with KUBECKPT_ASYNC_SAVE=false (the Trainer's save made atomic)

Printed, medians over the reps: (a) train() wall time and process CPU time, and the time spent
inside kubeckpt's callback (every event, timed) as a share of the plain run's wall time (on a
machine shared with other work, wall time swings by more than the overhead; the timed share does
not); (b) the stall of one checkpoint: the time the training thread spends in the save (for
kubeckpt: sentinel + barrier, waiting for the previous save, staging; for HF: `_save_checkpoint`),
and the whole wall-time cost of periodic saves against the no-save run. Ratios are against the
baselines of the same run.
Targets (issue 6): callback overhead <= 2% of wall time; async stall >= 10x less than HF's save.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

from trainer_runtime.config import Config
from trainer_runtime.hf import kubeckpt_trainer

SEQ = 64
VOCAB = 8192


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=512, n_layer=6, n_head=8)
    return GPT2LMHeadModel(cfg)


class Timings:
    """Seconds spent in wrapped calls, by name, and per save."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.save_stalls: list[float] = []
        self._current_save = 0.0

    def wrap(self, obj: Any, name: str, label: str, *, save_part: bool = False) -> None:
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self.total[label] += dt
                if save_part:
                    self._current_save += dt

        setattr(obj, name, timed)

    def end_save(self) -> None:
        self.save_stalls.append(self._current_save)
        self._current_save = 0.0


EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)


def run(kind: str, work: Path, steps: int, save_every: int) -> dict[str, Any]:
    out = work / kind
    shutil.rmtree(out, ignore_errors=True)
    hf_save = kind == "hf-save"
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-4,
        logging_steps=5,
        save_strategy="steps" if hf_save else "no",
        save_steps=save_every,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model(), args=args, train_dataset=TokenDataset(4 * steps))
    timings = Timings()
    callback = None
    if kind != "plain" and not hf_save:
        env = {
            "CHECKPOINT_ENABLED": "true",
            "CHECKPOINT_URI": str(out / "ckpt"),
            "CHECKPOINT_CONTROL_DIR": str(out / "run"),
            "TRAINING_PROGRESS_FILE": str(out / "progress.json"),
            "KUBECKPT_TERMINATION_LOG": str(out / "termination-log"),
            "PROGRESS_UPDATE_FREQUENCY": "5",
            "KUBECKPT_ASYNC_SAVE": "false" if kind == "ours-sync" else "true",
        }
        if kind == "kubeckpt":
            env.update(CHECKPOINT_STRATEGY="time", CHECKPOINT_INTERVAL="1h")
        else:
            env.update(CHECKPOINT_STRATEGY="steps", CHECKPOINT_SAVE_STEPS=str(save_every))
        trainer = kubeckpt_trainer(trainer, Config.from_env(env))
        callback = trainer.kubeckpt
        for event in EVENTS:
            if hasattr(callback, event):
                timings.wrap(callback, event, "callback", save_part=event == "on_save")
        timings.wrap(callback, "_begin", "begin", save_part=True)
    timings.wrap(trainer, "_save_checkpoint", "save", save_part=True)
    if callback is not None:
        on_save = callback.on_save

        def on_save_then_mark(*a: Any, **kw: Any) -> Any:
            try:
                return on_save(*a, **kw)
            finally:
                timings.end_save()

        callback.on_save = on_save_then_mark
    elif hf_save:
        save = trainer._save_checkpoint

        def save_then_mark(*a: Any, **kw: Any) -> Any:
            try:
                return save(*a, **kw)
            finally:
                timings.end_save()

        trainer._save_checkpoint = save_then_mark

    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    result: dict[str, Any] = {
        "wall": wall,
        "cpu": cpu,
        "callback": timings.total.get("callback", 0.0),
        "stalls": timings.save_stalls,
    }
    progress = out / "progress.json"
    if progress.exists():
        result["progress"] = json.loads(progress.read_text()).get("checkpointing", {})
    shutil.rmtree(out, ignore_errors=True)
    return result


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    hf_logging.set_verbosity_error()
    os.environ.setdefault("TQDM_DISABLE", "1")
    work = Path(a.dir or tempfile.mkdtemp(prefix="hf-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    m = model()
    params = sum(p.numel() for p in m.parameters())
    print(f"GPT-2 {params / 1e6:.1f}M params; checkpoint ~{params * 12 / 1e9:.2f} GB with Adam")
    print(f"{a.steps} steps, saves every {a.save_every}, {a.reps} reps, {a.threads} threads")

    kinds = ["plain", "kubeckpt", "hf-save", "ours-async", "ours-sync"]
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    run("plain", work, 5, a.save_every)  # warm-up: imports, allocator, page cache
    for rep in range(a.reps):
        for kind in kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]:  # rotate the order
            r = run(kind, work, a.steps, a.save_every)
            results[kind].append(r)
            stalls = ", ".join(f"{s:.3f}" for s in r["stalls"])
            print(
                f"rep {rep} {kind:11s} wall {r['wall']:7.2f} s  cpu {r['cpu']:7.2f} s"
                f"  callback {r['callback']:.3f} s"
                f"  save stalls [{stalls}]",
                flush=True,
            )
    shutil.rmtree(work, ignore_errors=True)

    wall = {k: med([r["wall"] for r in results[k]]) for k in kinds}
    cpu = {k: med([r["cpu"] for r in results[k]]) for k in kinds}
    print("\n(a) overhead, medians")
    cb = med([r["callback"] for r in results["kubeckpt"]])
    print(f"  plain train() wall                 {wall['plain']:.2f} s")
    print(
        f"  with kubeckpt (no saves due)       {wall['kubeckpt']:.2f} s  "
        f"({100 * (wall['kubeckpt'] / wall['plain'] - 1):+.1f}% wall)"
    )
    print(
        f"  process CPU time plain / kubeckpt  {cpu['plain']:.2f} / {cpu['kubeckpt']:.2f} s  "
        f"({100 * (cpu['kubeckpt'] / cpu['plain'] - 1):+.1f}%; less sensitive to other load)"
    )
    print(
        f"  time inside kubeckpt's callback    {cb:.3f} s  "
        f"({100 * cb / wall['plain']:.2f}% of plain wall; target <= 2%)"
    )
    fastest = min(r["wall"] for r in results["plain"])
    print(
        f"  per step: callback {1000 * cb / a.steps:.2f} ms, fastest plain step "
        f"{1000 * fastest / a.steps:.0f} ms ({100 * cb / fastest:.2f}% of the fastest plain run)"
    )
    for k in ("hf-save", "ours-async", "ours-sync"):
        print(
            f"  {k:11s} periodic saves wall   {wall[k]:.2f} s  "
            f"({100 * (wall[k] / wall['plain'] - 1):+.1f}% vs plain)"
        )

    print("\n(b) stall per checkpoint (training thread), median over all saves")
    stall = {k: med([s for r in results[k] for s in r["stalls"]]) for k in kinds[2:]}
    # The first save pays page faults into fresh staging buffers; later ones reuse them.
    later = med([s for r in results["ours-async"] for s in r["stalls"][1:]])
    for k in kinds[2:]:
        print(f"  {k:11s} {stall[k]:.3f} s")
    print(f"  ours-async, saves after the first {later:.3f} s")
    print(
        f"  HF sync save / ours-async stall   {stall['hf-save'] / stall['ours-async']:.1f}x "
        f"(target >= 10x)"
    )
    print(f"  HF sync save / ours-async (after first) {stall['hf-save'] / later:.1f}x")
    last = results["ours-async"][-1].get("progress", {})
    print(
        f"  ours-async last save: lastSaveSeconds {last.get('lastSaveSeconds')} "
        f"(to finalized), lastStallSeconds {last.get('lastStallSeconds')}"
    )


if __name__ == "__main__":
    main()
