"""trainer_runtime.hf.world_size: when the HF Trainer resumes a checkpoint of another world size
exactly, and the error where it would not.

The rule is checked against a model of what the Trainer does on resume, built from accelerate's
own BatchSamplerShard (batch i of the epoch's order to rank i % W): the samples of each optimizer
step, and the batches the Trainer skips (`(global_step % steps_per_epoch) * accumulation` per
rank). Then against a real Trainer (one process) and checkpoints with the files the Trainer writes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import BatchSampler, SequentialSampler
from transformers import Trainer, TrainingArguments

from trainer_runtime.hf.world_size import (
    Shape,
    WorldSizeError,
    check_resume,
    reasons_not_exact,
    saved_training_args,
    saved_world_size,
)


def step_samples(shape: Shape, samples: int, drop_last: bool) -> list[list[int]]:
    """The sample offsets (into the epoch's order) of each optimizer step of an epoch, all ranks
    together, as the Trainer with accelerate's sharding takes them."""
    batches = BatchSampler(SequentialSampler(range(samples)), shape.batch_size, drop_last)
    per_rank = [
        list(BatchSamplerShard(batches, num_processes=shape.world_size, process_index=r))
        for r in range(shape.world_size)
    ]
    steps = shape.steps_per_epoch(samples, drop_last)
    assert steps == max(-(-len(per_rank[0]) // shape.accumulation), 1)  # the Trainer's formula
    out = []
    for k in range(steps):
        micro = slice(k * shape.accumulation, (k + 1) * shape.accumulation)
        out.append(sorted(i for rank in per_rank for b in rank[micro] for i in b))
    return out


def resumed_steps(old: Shape, new: Shape, samples: int, drop_last: bool, step: int):
    """(epoch, the samples of each step from `step` on) of a resume at `step` with `new`."""
    per_epoch = new.steps_per_epoch(samples, drop_last)
    skipped = step % per_epoch  # the Trainer skips this many steps' batches on every rank
    return step // per_epoch, step_samples(new, samples, drop_last)[skipped:]


shapes = st.builds(
    Shape,
    world_size=st.integers(1, 4),
    batch_size=st.integers(1, 6),
    accumulation=st.integers(1, 3),
)


@settings(max_examples=300, deadline=None)
@given(old=shapes, new=shapes, samples=st.integers(1, 120), drop_last=st.booleans(),
       data=st.data())  # fmt: skip
def test_rule_matches_the_trainers_resume(old, new, samples, drop_last, data) -> None:
    reasons = reasons_not_exact(old, new, samples=samples, drop_last=drop_last)
    before = step_samples(old, samples, drop_last)
    step = data.draw(st.integers(1, len(before)), label="global_step")
    epoch, after = resumed_steps(old, new, samples, drop_last, step)
    if step == len(before):  # saved at the end of the epoch: the next one, from its start
        same = epoch == 1 and len(after) == len(before)
    else:  # mid-epoch: the same samples step for step (the last step may be padded otherwise)
        same = epoch == 0 and len(after) == len(before) - step
        same = same and after[:-1] == before[step:-1]
    if not reasons:
        assert same
    elif old.total != new.total and step < len(before) - 1 and samples >= 2 * old.total:
        assert not same  # a step that would take other samples than the saved run's


def test_reasons() -> None:
    two, one = Shape(2, 8, 1), Shape(1, 16, 1)
    assert reasons_not_exact(two, one, samples=100) == []
    assert reasons_not_exact(two, Shape(4, 4, 1), samples=100) == []
    assert reasons_not_exact(two, Shape(1, 8, 2), samples=100) == []
    (why,) = reasons_not_exact(two, Shape(4, 8, 1), samples=100)
    assert "from 16 (8 per device x 1 accumulation x 2 data-parallel ranks) to 32" in why
    assert (
        "group_by_length" in reasons_not_exact(two, one, samples=9, sampling="group_by_length")[0]
    )
    assert "no length" in reasons_not_exact(two, one, samples=None)[0]
    assert "universal" in reasons_not_exact(two, one, samples=100, deepspeed=True)[0]
    assert reasons_not_exact(two, one, samples=100, deepspeed=True, universal=True) == []
    # The same total batch, but drop_last cuts another number of steps per epoch.
    (why,) = reasons_not_exact(Shape(1, 2, 3), Shape(2, 3, 1), samples=11, drop_last=True)
    assert "steps per epoch change from 2 to 1" in why


# ----------------------------------------------------------------------- a real Trainer


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x, labels):  # pragma: no cover - never trained here
        return {"loss": nn.functional.cross_entropy(self.lin(x), labels)}


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):  # pragma: no cover
        return {"x": torch.zeros(2), "labels": torch.tensor(0)}


def trainer(tmp: Path, **kw) -> Trainer:
    args = TrainingArguments(output_dir=str(tmp / "out"), report_to=[], use_cpu=True, **kw)
    return Trainer(model=Tiny(), args=args, train_dataset=Data())


def checkpoint(tmp: Path, world: int, batch: int, accumulation: int, step: int = 3) -> Path:
    """The files of an HF checkpoint that matter here, as the Trainer writes them."""
    path = tmp / "out" / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(
        json.dumps({"global_step": step, "train_batch_size": batch, "epoch": 0.4})
    )
    args = TrainingArguments(
        output_dir=str(tmp / "old"),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        report_to=[],
        use_cpu=True,
    )
    torch.save(args, path / "training_args.bin")
    for r in range(world):
        (path / (f"rng_state_{r}.pth" if world > 1 else "rng_state.pth")).write_bytes(b"")
    return path


def test_training_args_read_without_running_code(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, 2, 4, 3)
    fields = saved_training_args(path)
    assert fields["gradient_accumulation_steps"] == 3
    assert fields["per_device_train_batch_size"] == 4
    assert saved_training_args(tmp_path) == {}
    assert saved_world_size(path) == 2


def test_same_total_batch_resumes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = checkpoint(tmp_path, world=2, batch=4, accumulation=1)
    with caplog.at_level(logging.INFO, logger="trainer_runtime.hf.world_size"):
        check_resume(trainer(tmp_path, per_device_train_batch_size=8), str(path))
        check_resume(
            trainer(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2),
            True,  # the Trainer's "the newest checkpoint in output_dir"
        )
    assert "exact" in caplog.text
    check_resume(trainer(tmp_path), None)


def test_other_total_batch_is_refused(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, world=2, batch=4, accumulation=2)
    with pytest.raises(WorldSizeError) as e:
        check_resume(trainer(tmp_path, per_device_train_batch_size=4), str(path))
    msg = str(e.value)
    assert "written by 2 ranks and this job has 1" in msg
    assert "from 16 (4 per device x 2 accumulation x 2 data-parallel ranks) to 4" in msg
    assert "gradient_accumulation_steps=4 or per_device_train_batch_size=16" in msg
    assert "ignore_data_skip=True" in msg
    # The user's way out: no data position restored, no check.
    check_resume(trainer(tmp_path, per_device_train_batch_size=4, ignore_data_skip=True), path)


def test_nothing_to_check(tmp_path: Path) -> None:
    t = trainer(tmp_path, per_device_train_batch_size=3)
    check_resume(t, checkpoint(tmp_path, world=1, batch=8, accumulation=1, step=2))  # same world
    check_resume(t, checkpoint(tmp_path, world=2, batch=8, accumulation=1, step=0))  # step 0
    unknown = tmp_path / "out" / "checkpoint-9"
    unknown.mkdir()
    check_resume(t, unknown)  # neither manifest nor RNG files: nothing known to compare


def test_group_by_length_is_refused(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, world=2, batch=4, accumulation=1)
    t = trainer(tmp_path, per_device_train_batch_size=8, train_sampling_strategy="group_by_length")
    with pytest.raises(WorldSizeError, match="group_by_length"):
        check_resume(t, path)
