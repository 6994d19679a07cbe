"""The stager's copier thread: late copies land, one thread serves every save, close ends it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from trainer_runtime.torch.staging import Stager

REPO = Path(__file__).resolve().parents[3]


def copier_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kubeckpt-stage")]


def test_late_copies_run_on_one_kept_thread() -> None:
    before = len(copier_threads())
    stager = Stager()
    tree = {"w": torch.randn(256, 256), "b": torch.randn(256), "n": torch.tensor(3)}
    late = {tree["w"].data_ptr(), tree["b"].data_ptr()}
    try:
        for round_ in range(3):
            staged = stager.stage(tree, late=lambda t: t.data_ptr() in late)
            staged.wait_before_update()  # the late copies have read their sources
            assert not staged.pending_late
            staged.wait()
            for key, src in tree.items():
                assert torch.equal(staged.tree[key], src), (round_, key)
                assert staged.tree[key].data_ptr() != src.data_ptr()
            with torch.no_grad():
                tree["w"].add_(1)  # the next save copies the new values
            assert len(copier_threads()) == before + 1
    finally:
        stager.close()
    assert len(copier_threads()) == before
    stager.close()  # idempotent


def test_a_failed_late_copy_is_reported_by_wait_and_the_thread_goes_on() -> None:
    stager = Stager()
    try:
        # A meta tensor has no bytes to copy: the copy raises on the copier thread.
        staged = stager.stage({"w": torch.empty(64, 64, device="meta")}, late=lambda t: True)
        staged.wait_before_update()  # training is not the one to be told
        try:
            staged.wait()
        except RuntimeError as e:
            assert "staging the checkpoint failed" in str(e)
        else:
            raise AssertionError("wait() did not report the copy's failure")
        src = torch.randn(64, 64)
        again = stager.stage({"w": src}, late=lambda t: True)
        again.wait()
        assert torch.equal(again.tree["w"], src)
    finally:
        stager.close()


MODEL = """
import sys
from pathlib import Path
from types import SimpleNamespace
import torch
from torch import nn

root = Path(sys.argv[1])
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)])  # 0.4 GiB with Adam's state
opt = torch.optim.Adam(model.parameters())
model(torch.randn(4, 2048)).sum().backward()
opt.step()
"""
# The torch adapter: the optimizer has state, so step_end warms the buffers in the background.
TORCH = """
from trainer_runtime.torch import CheckpointManager

env = {
    "CHECKPOINT_ENABLED": "true",
    "CHECKPOINT_URI": str(root / "persistent"),
    "CHECKPOINT_SAVE_STEPS": "1000",
    "CHECKPOINT_JIT": "false",
    "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
    "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
}
mgr = CheckpointManager.from_env(model, opt, environ=env)
mgr.restore()
mgr.step_end(1)
mgr.close()
print("closed", flush=True)
"""
# The HF Trainer's stager, warmed as the callback warms it after the first step (a Trainer's
# few attributes it reads: a plain module is saved as raw safetensors).
HF = """
from trainer_runtime.hf import async_save

trainer = SimpleNamespace(
    model=model,
    optimizer=opt,
    args=SimpleNamespace(should_save=True, save_only_model=False),
    accelerator=SimpleNamespace(unwrap_model=lambda m, keep_torch_compile=False: m),
)
async_save.Stager().warm(trainer)
print("closed", flush=True)
"""


@pytest.mark.parametrize("adapter", ["torch", "hf"])
def test_a_process_that_ends_while_the_buffers_warm_exits_cleanly(
    tmp_path: Path, adapter: str
) -> None:
    # The warm-up used to run on a daemon thread, still filling buffers when the interpreter
    # shut down: torch aborted the process ("terminate called without an active exception",
    # SIGABRT, exit 134), so a short job failed after finishing. The torch adapter's close()
    # waits for its copier thread; the HF stager's warm-up thread is no daemon.
    proc = subprocess.run(
        [sys.executable, "-c", MODEL + (TORCH if adapter == "torch" else HF), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "closed" in proc.stdout
