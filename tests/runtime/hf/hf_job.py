"""An HF Trainer script for the 2-rank scenario (run under torchrun by test_torchrun.py).

With CHECKPOINT_ENABLED=true it adopts kubeckpt in one line; otherwise it is a plain HF run.
Each rank writes its pid (so a test can signal one rank) and, at the end, the step it stopped at;
rank 0 also writes the final parameters.
"""

from __future__ import annotations

import argparse
import errno
import faulthandler
import json
import os
import signal
import time
from pathlib import Path

import torch
from tiny_hf import TokenDataset, tiny_gpt2
from transformers import Trainer, TrainerCallback, TrainingArguments


class Sleep(TrainerCallback):
    """Sleeps after each step and records the step reached (a test sees where each rank is)."""

    def __init__(self, seconds: float, status_dir: Path, rank: int) -> None:
        self.seconds = seconds
        self.step_file = status_dir / f"step-{rank}"

    def on_step_end(self, args, state, control, **kwargs):
        self.step_file.write_text(str(state.global_step))
        time.sleep(self.seconds)


def die_in_save(trainer: Trainer, step: int) -> None:
    """Kill the process inside the save at `step`: after the model is written, before the RNG
    and trainer state are (the crash a preemption without grace causes). With kubeckpt's async
    save the writes happen on its save thread, so that is where it dies."""
    if getattr(getattr(trainer, "kubeckpt", None), "async_save", False):
        from trainer_runtime.hf import async_save

        persist = async_save.Snapshot.persist

        def dying_persist(snapshot: async_save.Snapshot) -> list[str]:
            if snapshot.output_dir.endswith(f"checkpoint-{step}"):
                snapshot.torch_files, snapshot.blobs = [], []  # the model only
                persist(snapshot)
                os._exit(137)
            return persist(snapshot)

        async_save.Snapshot.persist = dying_persist  # type: ignore[method-assign]
        return
    save_rng_state = trainer._save_rng_state

    def dying(output_dir: str) -> None:
        if trainer.state.global_step == step:
            os._exit(137)
        save_rng_state(output_dir)

    trainer._save_rng_state = dying


def full_disk(step: int) -> None:
    """This rank's async write of `step` fails as on a full disk (after writing part of it)."""
    from trainer_runtime.hf import async_save

    persist = async_save.Snapshot.persist

    def failing(snapshot: async_save.Snapshot) -> list[str]:
        if snapshot.output_dir.endswith(f"checkpoint-{step}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return persist(snapshot)

    async_save.Snapshot.persist = failing  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--status-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--die-in-save", type=int, default=0, help="exit hard mid-save at step")
    parser.add_argument(
        "--hf-jit", action="store_true", help="transformers' own enable_jit_checkpoint instead"
    )
    parser.add_argument(
        "--resume-latest", action="store_true", help="train(resume_from_checkpoint=True)"
    )
    parser.add_argument(
        "--enospc-at", type=int, default=0, help="this rank's async write fails at this step"
    )
    parser.add_argument("--enospc-rank", type=int, default=1)
    a = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a test can see where a rank hangs
    a.status_dir.mkdir(parents=True, exist_ok=True)
    (a.status_dir / f"pid-{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    model = tiny_gpt2()
    args = TrainingArguments(
        output_dir=str(a.status_dir / "hf-output"),
        max_steps=a.steps,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        seed=0,
        disable_tqdm=True,
        enable_jit_checkpoint=a.hf_jit,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenDataset(),
        callbacks=[Sleep(a.sleep, a.status_dir, rank)],
    )
    if os.environ.get("CHECKPOINT_ENABLED") == "true":
        from trainer_runtime.hf import kubeckpt_trainer

        trainer = kubeckpt_trainer(trainer)
    if a.die_in_save:
        die_in_save(trainer, a.die_in_save)
    if a.enospc_at and rank == a.enospc_rank:
        full_disk(a.enospc_at)
    trainer.train(resume_from_checkpoint=True if a.resume_latest else None)
    kubeckpt = getattr(trainer, "kubeckpt", None)
    (a.status_dir / f"stopped-{rank}.json").write_text(
        json.dumps(
            {
                "step": trainer.state.global_step,
                "async": bool(kubeckpt is not None and kubeckpt.async_save),
            }
        )
    )
    if rank == 0:
        state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        torch.save(state, a.status_dir / "final.pt")
    if torch.distributed.is_initialized():
        # As a torchrun script should: left to interpreter exit, the Trainer's gloo group can
        # abort a rank whose peer has already exited ("terminate called without an active
        # exception", SIGABRT), failing a run that trained and saved correctly.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
