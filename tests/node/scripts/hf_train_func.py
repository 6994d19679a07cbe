"""A `train_func` as the Kubeflow SDK runs one in a TrainJob (the seed documents' shape): the
transformers Trainer with periodic saves every N steps and `save_total_limit`, kubeckpt adopted in
one line (JIT and resume come from the environment the webhook injected), and `report_to="all"`,
so transformers' KubeflowCallback joins in when Trainer's TrainJobStatus gate injects its status
server. Writes `exit.json` (step, whether it stopped for a JIT checkpoint, what it resumed from,
and at the end a SHA-256 of the parameters) into --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path


def train_func(steps: int, save_steps: int, sleep: float, out: Path) -> int:
    import torch
    from tiny_hf import TokenDataset, tiny_gpt2
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from trainer_runtime.hf import kubeckpt_trainer

    class Pace(TrainerCallback):
        """Stands in for real work per step."""

        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(sleep)

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    args = TrainingArguments(
        output_dir=os.environ.get("CHECKPOINT_URI", "/tmp/out"),
        max_steps=steps,
        per_device_train_batch_size=2,
        learning_rate=float(os.environ.get("LEARNING_RATE", "1e-2")),
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=2,
        report_to="all",
        use_cpu=True,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        seed=0,
        disable_tqdm=True,
    )
    trainer = kubeckpt_trainer(
        Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenDataset(256), callbacks=[Pace()])
    )
    kubeflow = [
        c for c in trainer.callback_handler.callbacks if type(c).__name__ == "KubeflowCallback"
    ]
    print(f"[rank {rank}] KubeflowCallback active: {bool(kubeflow)}", flush=True)
    trainer.train()
    step = trainer.state.global_step
    info = {
        "step": step,
        "stopped": trainer.kubeckpt.stopped,
        "resumed_from": trainer.kubeckpt.resumed_from,
    }
    if not trainer.kubeckpt.stopped:
        h = hashlib.sha256()
        for name, t in trainer.model.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().contiguous().numpy().tobytes())
        info["sha256"] = h.hexdigest()
    print(f"[rank {rank}] {json.dumps(info)}", flush=True)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "exit.json").write_text(json.dumps(info))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return trainer.kubeckpt.exit_code


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-steps", type=int, default=20)
    ap.add_argument("--sleep", type=float, default=0.2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/out"))
    a = ap.parse_args()
    sys.exit(train_func(a.steps, a.save_steps, a.sleep, a.out))
