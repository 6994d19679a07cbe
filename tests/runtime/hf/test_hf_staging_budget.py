"""The HF Trainer's async save under the staging budget (KUBECKPT_STAGING_BUDGET_BYTES, read as
torch's is): a state over the budget is not copied, so what the stager allocates stays within the
budget, training is held until the files are written instead, and the files are still the
Trainer's own byte for byte and resume to the exact step. Within the budget nothing changes."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from kubeckpt_env import kubeckpt_env as _env
from test_callback import _args
from tiny_hf import TokenDataset, tiny_gpt2
from transformers import Trainer, TrainerCallback

from trainer_runtime import layout
from trainer_runtime.config import Config
from trainer_runtime.contract import ContractError
from trainer_runtime.hf import KubeckptCallback, async_save, kubeckpt_trainer
from trainer_runtime.hf.async_save import Staging, choose
from trainer_runtime.protocol.session import SaveSession

STEPS = 10
BUFFER_BYTES = 4096  # a persistent buffer: what forward may change, copied even when held


def _model() -> torch.nn.Module:
    model = tiny_gpt2()
    model.register_buffer("calibration", torch.arange(BUFFER_BYTES // 4, dtype=torch.float32))
    return model


def _trainer(tmp: Path) -> Trainer:
    return Trainer(model=_model(), args=_args(tmp / "unused-output"), train_dataset=TokenDataset())


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "manifest.json"}


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    """The same run, uninterrupted and without kubeckpt."""
    torch.set_num_threads(1)
    trainer = _trainer(Path("/nonexistent"))
    trainer.train()
    return _params(trainer.model)


def _state_bytes(tmp: Path) -> tuple[int, int]:
    """(a whole copy, what forward may change) for this model after a step, as the stager sees
    them: the test's budgets are placed between them."""
    trainer = kubeckpt_trainer(
        _trainer(tmp), Config.from_env(_env(tmp, KUBECKPT_ASYNC_SAVE="false"))
    )
    trainer.args.max_steps = 1
    trainer.train()
    return async_save.Stager().sizes(trainer)


def test_choose_fits_the_budget_or_holds_training() -> None:
    assert choose(100, 10, 100, can_hold=True).mode is Staging.WHOLE
    held = choose(100, 10, 99, can_hold=True)
    assert held.mode is Staging.HELD and held.staged_bytes == 10
    assert "100 bytes" in held.note() and "99 bytes" in held.note()
    assert choose(100, 10, 9, can_hold=True).mode is Staging.BLOCKING
    # No pre-step hook to wait in: the save blocks rather than letting an update race the write.
    assert choose(100, 10, 99, can_hold=False).mode is Staging.BLOCKING
    assert choose(100, 10, 9, can_hold=False).staged_bytes == 0
    assert choose(100, 10, 100, can_hold=True).note() is None


@pytest.mark.parametrize("mode", [Staging.HELD, Staging.BLOCKING])
def test_over_budget_save_stays_within_it_and_is_the_trainers_own(
    tmp_path, monkeypatch, caplog, reference, mode
):
    need, changed = _state_bytes(tmp_path / "size")
    assert changed >= BUFFER_BYTES and need > changed + 1024
    budget = changed + 1024 if mode is Staging.HELD else changed - 1
    root = tmp_path / "ckpt"

    # The Trainer's own (synchronous) save, for the bytes.
    trainer = kubeckpt_trainer(
        _trainer(tmp_path), Config.from_env(_env(tmp_path, KUBECKPT_ASYNC_SAVE="false"))
    )
    trainer.train()
    sync = {s: _files(root / f"checkpoint-{s}") for s in (4, 8)}
    shutil.rmtree(root)

    # Ours, over the budget. Each write is slowed: with the state not copied, training must not
    # update it meanwhile (HELD runs the next step's forward, then waits; BLOCKING runs nothing).
    forwards = []
    staged_at = []
    seen = []
    stage, persist = async_save.stage, async_save.Snapshot.persist

    def counted(trainer, stager, step, **kwargs):
        staged_at.append(len(forwards))
        return stage(trainer, stager, step, **kwargs)

    def slow(snapshot):
        before = _params(ours.model)
        time.sleep(0.5)  # several training steps' worth
        after = _params(ours.model)
        seen.append((snapshot.bytes_staged, after, before, len(forwards) - staged_at[-1]))
        return persist(snapshot)

    results = []
    run = SaveSession._run

    def recorded(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        results.append(result)
        return result

    monkeypatch.setattr(async_save, "stage", counted)
    monkeypatch.setattr(async_save.Snapshot, "persist", slow)
    monkeypatch.setattr(SaveSession, "_run", recorded)
    env = _env(tmp_path, KUBECKPT_STAGING_BUDGET_BYTES=str(budget))
    ours = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(env))
    ours.model.register_forward_hook(lambda *_: forwards.append(1))
    with caplog.at_level(logging.INFO, logger="trainer_runtime.hf.callback"):
        ours.train()

    assert ours.state.global_step == STEPS and ours.kubeckpt.failed_saves == 0
    stager = ours.kubeckpt.stager
    assert stager.peak_bytes <= budget, (stager.peak_bytes, budget)
    assert stager.held_bytes <= budget
    assert len(seen) == 2
    for staged, after, before, forwards_during in seen:
        assert staged <= budget
        for name, value in before.items():  # no update while the state was being written
            torch.testing.assert_close(after[name], value, rtol=0, atol=0, msg=name)
        assert forwards_during == (1 if mode is Staging.HELD else 0)
    assert ours.kubeckpt.saves_over_budget == 2
    assert [r.staging_note is not None for r in results] == [True, True]
    assert f"({budget} bytes)" in results[0].staging_note
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "exceeds the staging budget" in warnings[0].getMessage()

    assert [(e.step, e.complete) for e in layout.scan(root)] == [(4, True), (8, True)]
    for step in (4, 8):
        files = _files(root / f"checkpoint-{step}")
        assert sorted(files) == sorted(sync[step])
        for name in sync[step]:
            assert files[name] == sync[step][name], f"checkpoint-{step}/{name} differs"

    # Plain transformers resumes from it and ends exactly where an uninterrupted run does.
    plain = _trainer(tmp_path)
    plain.train(resume_from_checkpoint=str(root / "checkpoint-8"))
    assert plain.state.global_step == STEPS
    for name, value in _params(plain.model).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)


def test_within_budget_nothing_changes(tmp_path, monkeypatch):
    """A budget above the state: buffers warmed ahead and reused, training goes on while the
    files are written, no warning, no note."""
    need, _ = _state_bytes(tmp_path / "size")
    forwards = []
    staged_at = []
    seen = []
    stage, persist = async_save.stage, async_save.Snapshot.persist

    def counted(trainer, stager, step, **kwargs):
        staged_at.append(len(forwards))
        return stage(trainer, stager, step, **kwargs)

    def slow(snapshot):
        time.sleep(0.5)
        seen.append((snapshot.staging_note, snapshot.bytes_staged, len(forwards) - staged_at[-1]))
        return persist(snapshot)

    monkeypatch.setattr(async_save, "stage", counted)
    monkeypatch.setattr(async_save.Snapshot, "persist", slow)
    env = _env(tmp_path, KUBECKPT_STAGING_BUDGET_BYTES=str(need))
    trainer = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(env))
    trainer.model.register_forward_hook(lambda *_: forwards.append(1))
    trainer.train()
    assert trainer.kubeckpt.saves_over_budget == 0
    stager = trainer.kubeckpt.stager
    assert stager.held_bytes == need and stager.peak_bytes == need  # one set, reused
    assert [(note, staged) for note, staged, _ in seen] == [(None, need), (None, need)]
    # The step-4 write: training went on through steps 5-7 (and 8's forward) meanwhile.
    assert seen[0][2] >= 3, seen


class _SigtermAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 5:
            os.kill(os.getpid(), signal.SIGTERM)


def test_stop_over_budget_saves_and_resumes_exactly(tmp_path, reference):
    """A just-in-time save over the budget: durable before train() returns, the stager within
    the budget, and a new run resumes from it to the uninterrupted run's exact weights."""
    need, changed = _state_bytes(tmp_path / "size")
    budget = changed + 1024
    env = _env(
        tmp_path,
        CHECKPOINT_STRATEGY="time",
        CHECKPOINT_INTERVAL="1h",
        KUBECKPT_STAGING_BUDGET_BYTES=str(budget),
    )
    first = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(env))
    first.callback_handler.callbacks.insert(0, _SigtermAt())
    previous = signal.getsignal(signal.SIGTERM)
    try:
        first.train()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert first.kubeckpt.stopped and first.state.global_step == 5
    assert first.kubeckpt.saves_over_budget == 1 and first.kubeckpt.failed_saves == 0
    assert first.kubeckpt.stager.peak_bytes <= budget < need
    root = tmp_path / "ckpt"
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(5, True)]

    second = kubeckpt_trainer(_trainer(tmp_path), Config.from_env(env))
    second.train()
    assert second.kubeckpt.resumed_from == str(root / "checkpoint-5")
    assert second.state.global_step == STEPS
    for name, value in _params(second.model).items():
        torch.testing.assert_close(value, reference[name], rtol=0, atol=0, msg=name)


def test_a_bad_budget_is_a_clear_error(tmp_path, monkeypatch):
    for name, value in _env(tmp_path, KUBECKPT_STAGING_BUDGET_BYTES="2GiB").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ContractError) as err:
        KubeckptCallback.from_env()
    assert err.value.field == "KUBECKPT_STAGING_BUDGET_BYTES"
    assert "2GiB" in str(err.value)
