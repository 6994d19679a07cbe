"""A PyTorch loop (library mode) after a just-in-time stop, in-process (one rank, no group): the
loop learns of the stop from `step_end` returning True and `mgr.stopped`; one that ignores it and
calls `step_end` again is warned, once, and nothing more is saved (issue 29, item 4)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import torch
from harness import ckpt_env

from trainer_runtime import layout
from trainer_runtime.contract import PREEMPTED_EXIT_CODE
from trainer_runtime.torch import CheckpointManager

IGNORED = "kubeckpt: step_end() was called again after it returned True"


def test_a_loop_that_ignores_the_stop_is_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    env = ckpt_env(tmp_path, CHECKPOINT_SAVE_STEPS="100", CHECKPOINT_LOCAL_DIR="")
    mgr = CheckpointManager.from_env(model, opt, total_steps=20, environ=env)
    caplog.set_level(logging.WARNING, logger="trainer_runtime.stop")
    try:
        mgr.restore()
        returned = []
        for step in range(1, 9):
            loss = model(torch.ones(1, 4)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets a flag
            returned.append(mgr.step_end(step, loss=loss.detach()))  # True ignored: goes on
        stopped_at = returned.index(True) + 1
        assert 2 <= stopped_at < 8 and all(returned[stopped_at - 1 :]), returned
        assert mgr.stopped and mgr.exit_code == PREEMPTED_EXIT_CODE
        warnings = [r.getMessage() for r in caplog.records if IGNORED in r.getMessage()]
        assert len(warnings) == 1, caplog.text  # said once, however often it is ignored
        assert f"at step {stopped_at}" in warnings[0] and "mgr.exit_code" in warnings[0]
        # The stop's checkpoint is the last one: the steps trained after it are not saved.
        persistent = tmp_path / "persistent"
        assert [(e.step, e.complete) for e in layout.scan(persistent)] == [(stopped_at, True)]
    finally:
        mgr.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
