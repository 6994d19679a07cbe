"""A plain HF Trainer script, LoRA through peft on a tiny Llama (as in the Kubeflow examples).

It knows nothing of kubeckpt: zero-code mode must attach checkpointing to it from the outside
(test_zerocode.py runs it under torchrun with the hook on PYTHONPATH). For the test it writes each
rank's pid (so one rank can be signalled) and, from inside `train()`, the step the Trainer ended
at (`train-end-<rank>.json`). After `train()`, its end-of-training code, which a preempted run
never reaches in zero-code mode: each rank writes `stopped-<rank>.json`, rank 0 the trainable
(LoRA) parameters and the Trainer's loss history.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from tiny_hf import SEQ, TokenDataset
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class Sleep(TrainerCallback):
    """Slows steps down so that a signal lands mid-epoch; records the step the Trainer ended at."""

    def __init__(self, seconds: float, status_dir: Path, rank: int) -> None:
        self.seconds = seconds
        self.end_file = status_dir / f"train-end-{rank}.json"

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)

    def on_train_end(self, args, state, control, **kwargs):
        self.end_file.write_text(json.dumps({"step": state.global_step}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--status-dir", type=Path, required=True)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    a = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    a.status_dir.mkdir(parents=True, exist_ok=True)
    (a.status_dir / f"pid-{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
        )
    )
    model = get_peft_model(
        base,
        LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            task_type="CAUSAL_LM",
        ),
    )
    args = TrainingArguments(
        output_dir=str(a.output_dir),
        num_train_epochs=a.epochs,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenDataset(),
        callbacks=[Sleep(a.sleep, a.status_dir, rank)],
    )
    trainer.train()
    (a.status_dir / f"stopped-{rank}.json").write_text(
        json.dumps({"step": trainer.state.global_step})
    )
    if rank == 0:
        lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        torch.save(lora, a.status_dir / "final.pt")
        history = [h for h in trainer.state.log_history if "loss" in h]
        (a.status_dir / "history.json").write_text(json.dumps(history))


if __name__ == "__main__":
    main()
