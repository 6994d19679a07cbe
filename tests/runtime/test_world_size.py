"""A DCP checkpoint written by 2 DDP ranks mid-epoch resumes on 1 and on 4 ranks (an elastic
PyTorchJob that changed its size) and on 2.

"Exact" on another world size (ResumableSampler's docstring, docs/trainer_runtime.md): model,
optimizer, scheduler and scaler state are bitwise the saved ones, step and epoch as saved; the
rest of the epoch serves every sample the old ranks had not consumed exactly once, in the epoch's
order (the new ranks read round-robin), none skipped, none repeated; the next epoch is a plain
DistributedSampler epoch on the new ranks. On the same world size the resumed run ends bitwise
equal to one never stopped (test_exactness.py's guarantee, here with the sample ids checked too).
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from harness import assert_same, ckpt_env, finish, start, tail_of, torchrun
from torch.utils.data import DistributedSampler

from trainer_runtime.contract import is_complete, read_manifest

JOB = Path(__file__).with_name("world_size_job.py")
SAMPLES, BATCH, SEED = 500, 16, 7  # world_size_job.py's
STOP = 5  # the checkpoint's step: 2 ranks x 5 steps x 16 = the first 160 samples of epoch 0
OLD = 2


def _argv(world: int, status: Path, steps: int) -> list[str]:
    args = [f"--status-dir={status}", f"--steps={steps}"]
    if world == 1:  # a single process, no process group: how a 1-pod job runs
        return [sys.executable, str(JOB), *args]
    return torchrun(JOB, *args, nproc=world)


def _env(root: Path, **overrides: str) -> dict[str, str]:
    env = ckpt_env(root, **overrides)
    del env["CHECKPOINT_LOCAL_DIR"]  # the persistent (DCP) tier only: what another size reads
    return env


def _run(world: int, root: Path, status: Path, steps: int, **env: str) -> list[dict]:
    proc = start(_argv(world, status, steps), _env(root, **env), root / f"run-{world}.log")
    assert finish(proc, timeout=240) == 0, tail_of(proc)
    return [torch.load(status / f"final-{r}.pt", weights_only=True) for r in range(world)]


def _order(epoch: int) -> list[int]:
    return torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def _round_robin(per_rank: list[list[int]]) -> list[int]:
    """The global order of DistributedSampler's interleaving: item k of rank 0, 1, ..., then k+1."""
    assert len({len(x) for x in per_rank}) == 1, [len(x) for x in per_rank]
    return [i for items in zip(*per_rank, strict=True) for i in items]


def _ids(final: dict, epoch: int) -> list[int]:
    return [i for _, e, ids in final["batches"] if e == epoch for i in ids]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """2 ranks train STOP steps and save there (mid-epoch: a DCP checkpoint); their final state
    is the checkpoint's."""
    root = tmp_path_factory.mktemp("written-by-2")
    finals = _run(OLD, root, root / "status", STOP, CHECKPOINT_SAVE_STEPS=str(STOP))
    ckpt = root / "persistent" / f"checkpoint-{STOP}"
    assert is_complete(ckpt), f"no checkpoint at {ckpt}"
    manifest = read_manifest(ckpt)
    assert manifest.world_size == OLD and manifest.extra["kubeckpt"]["format"] == "dcp"
    consumed = _round_robin([_ids(f, 0) for f in finals])
    assert consumed == _order(0)[: OLD * STOP * BATCH]  # a prefix of the epoch's order
    return root, finals


def _resume(saved: tuple[Path, list[dict]], tmp_path: Path, world: int, steps: int):
    root, finals = saved
    shutil.copytree(root / "persistent", tmp_path / "persistent")
    status = tmp_path / "status"
    resumed = _run(world, tmp_path, status, steps, CHECKPOINT_SAVE_STEPS="1000")
    restored = [torch.load(status / f"restored-{r}.pt", weights_only=True) for r in range(world)]
    return finals, restored, resumed


@pytest.mark.parametrize("world", [1, 4])
def test_resume_on_another_world_size(
    saved: tuple[Path, list[dict]], tmp_path: Path, world: int
) -> None:
    done = OLD * STOP * BATCH
    rest = SAMPLES - done
    left_steps = math.ceil(math.ceil(rest / world) / BATCH)  # to the end of epoch 0 ...
    steps = STOP + left_steps + 2  # ... and two steps into epoch 1
    finals, restored, resumed = _resume(saved, tmp_path, world, steps)
    old = finals[0]  # the tensors DCP keeps: rank 0's copy (BatchNorm statistics included)
    for rank, state in enumerate(restored):
        assert state["resumed_from"] == f"checkpoint-{STOP}", (rank, state["resumed_from"])
        assert (state["step"], state["epoch"]) == (STOP, 0), rank
        for key in ("model", "optim", "scheduler", "scaler"):
            assert_same(old[key], state[key], f"rank {rank} {key}")
        sampler = state["sampler"]
        assert sampler["num_replicas"] == world and sampler["epoch"] == 0, sampler
        assert (sampler["start"], sampler["done"], sampler["position"]) == (done, [], 0)

    # The rest of epoch 0: every sample not consumed before the stop, once, in the epoch's order.
    assert rest % world == 0, "pick sizes without DistributedSampler padding for this check"
    served = _round_robin([_ids(f, 0) for f in resumed])
    before = _round_robin([_ids(f, 0) for f in finals])
    assert served == _order(0)[done:]
    assert sorted(before + served) == list(range(SAMPLES)), "a sample skipped or repeated"
    # Then epoch 1 is DistributedSampler's on the new ranks.
    for rank, final in enumerate(resumed):
        ref = DistributedSampler(
            range(SAMPLES), num_replicas=world, rank=rank, shuffle=True, seed=SEED
        )
        ref.set_epoch(1)
        took = _ids(final, 1)
        assert took and took == list(ref)[: len(took)], rank
        assert final["step"] == steps and final["epoch"] == 1
        assert [s for s, _, _ in final["batches"]] == list(range(STOP + 1, steps + 1))


def test_resume_on_the_same_world_size(saved: tuple[Path, list[dict]], tmp_path: Path) -> None:
    steps = STOP + 14  # past the end of epoch 0 (16 steps on 2 ranks)
    finals, restored, resumed = _resume(saved, tmp_path, OLD, steps)
    for rank, state in enumerate(restored):
        assert (state["step"], state["epoch"]) == (STOP, 0)
        assert state["sampler"]["position"] == STOP * BATCH and state["sampler"]["start"] == 0
        for key in ("model", "optim", "scheduler", "scaler"):  # its own buffers: bitwise
            assert_same(finals[rank][key], state[key], f"rank {rank} {key}")
    # Bitwise what a run never stopped gives, batch for batch.
    (tmp_path / "reference").mkdir()
    reference = _run(OLD, tmp_path / "reference", tmp_path / "reference" / "status", steps,
                     CHECKPOINT_ENABLED="false")  # fmt: skip
    for rank in range(OLD):
        ref, got = reference[rank], resumed[rank]
        assert got["batches"] == [b for b in ref["batches"] if b[0] > STOP], rank
        for key in ("model", "optim", "scheduler", "scaler", "sampler"):
            assert_same(ref[key], got[key], f"rank {rank} {key}")
