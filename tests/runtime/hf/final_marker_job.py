"""An HF Trainer script with end-of-training code: after `trainer.train()` it writes a "final"
marker, as a real script saves its final model or writes the DONE marker a pipeline trusts
(test_stop_ends_script.py runs it).

--mode zerocode: the script knows nothing of kubeckpt (the hook on PYTHONPATH attaches it);
library: it adopts kubeckpt with `kubeckpt_trainer` and ignores the stop; pattern: the same, with
the documented check after `train()`. It can send itself SIGTERM at a step (the preemption), and
make every checkpoint write fail as on a full disk. The step the Trainer ended at is recorded from
inside `train()` (on_train_end), so it is there whether or not the code after `train()` runs.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sys
from pathlib import Path

import torch
from tiny_hf import TokenDataset, tiny_gpt2
from transformers import Trainer, TrainerCallback, TrainingArguments


class Preempt(TrainerCallback):
    """SIGTERM to this process at a step (what the kubelet sends); the Trainer's end recorded."""

    def __init__(self, at: int, status_dir: Path) -> None:
        self.at = at
        self.status_dir = status_dir

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_end(self, args, state, control, **kwargs):
        (self.status_dir / "train-end.json").write_text(json.dumps({"step": state.global_step}))


def full_disk() -> None:
    """Every checkpoint write fails (ENOSPC) after it started: the stop's save fails."""
    from trainer_runtime.hf import async_save

    def failing(snapshot: async_save.Snapshot) -> list[str]:
        raise OSError(errno.ENOSPC, "No space left on device")

    async_save.Snapshot.persist = failing  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["zerocode", "library", "pattern"], required=True)
    parser.add_argument("--status-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sigterm-at", type=int, default=0)
    parser.add_argument("--full-disk", action="store_true")
    a = parser.parse_args()
    a.status_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=str(a.status_dir / "hf-output"),
        max_steps=a.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=tiny_gpt2(),
        args=args,
        train_dataset=TokenDataset(),
        callbacks=[Preempt(a.sigterm_at, a.status_dir)],
    )
    if a.mode != "zerocode":
        from trainer_runtime.hf import kubeckpt_trainer

        trainer = kubeckpt_trainer(trainer)
    if a.full_disk:
        full_disk()
    try:
        trainer.train()
    finally:
        # Cleanup a script may keep in `finally`: it must not run after a zero-code stop either.
        (a.status_dir / "finally").write_text("ran")
    if a.mode == "pattern" and trainer.kubeckpt.stopped:  # the documented pattern
        sys.exit(trainer.kubeckpt.exit_code)
    trainer.save_model(str(a.status_dir / "final-model"))
    (a.status_dir / "final").write_text(json.dumps({"step": trainer.state.global_step}))
    print("final marker written", flush=True)


if __name__ == "__main__":
    main()
