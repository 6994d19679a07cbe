"""The environment the webhook would inject, for an HF test's Trainer in `tmp` (shared by the
HF runtime tests)."""

from __future__ import annotations

from pathlib import Path


def kubeckpt_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(tmp / "ckpt"),
        "TRAINING_PROGRESS_FILE": str(tmp / "progress.json"),
        "CHECKPOINT_CONTROL_DIR": str(tmp / "run"),
        "KUBECKPT_TERMINATION_LOG": str(tmp / "termination-log"),
        "PROGRESS_UPDATE_FREQUENCY": "1",
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "4",
    }
    env.update(extra)
    return env
