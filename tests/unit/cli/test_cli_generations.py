"""`kubeckpt checkpoints` on a job re-created with resume "false": the earlier run's checkpoints
and the new generation's are both listed, each named where it lives under CHECKPOINT_URI, the
newest generation first and each by commit order (trainer_runtime/generations.py)."""

from __future__ import annotations

import json
from pathlib import Path

from kubeckpt_cli import checkpoints as ck
from kubeckpt_cli.view import checkpoint_name
from tests.support.cli_objects import tp, training_status
from trainer_runtime import listing
from trainer_runtime.contract import MANIFEST_GENERATION, MANIFEST_SEQUENCE, build_manifest
from trainer_runtime.storage import LocalTier


def _commit(tier: LocalTier, step: int, sequence: int) -> None:
    d = tier.begin(step)
    (d / "model.pt").write_bytes(b"m" * 100)
    extra = {MANIFEST_SEQUENCE: sequence, MANIFEST_GENERATION: tier.generation, "reason": "jit"}
    m = build_manifest(
        d, step=step, epoch=0, world_size=1, framework="torch", tier=tier.name, extra=extra
    )
    tier.commit(step, m)


def test_generations_in_the_checkpoint_table(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "ckpt", "persistent")
    for step, seq in ((3000, 1), (4000, 2), (5000, 3)):
        _commit(tier, step, seq)
    tier.generation = 1
    _commit(tier, 100, 4)
    _commit(tier, 50, 5)  # committed last, at a lower step
    local = LocalTier(tmp_path / "ramdisk", "local")
    local.generation = 0  # the ramdisk has no generation directories
    d = local.begin(60)
    (d / "r.pt").write_bytes(b"r")
    extra = {MANIFEST_SEQUENCE: 6, MANIFEST_GENERATION: 1}
    local.commit(
        60,
        build_manifest(d, step=60, epoch=0, world_size=1, framework="t", tier="local", extra=extra),
    )
    doc = json.loads(listing.render(listing.listing(tier.root, local.root)))
    status = training_status(60)
    status["resumedFrom"] = "generation-1/checkpoint-100"  # what the runtime reports
    ck.add_reasons(doc, tp("llama", "ns", status=status))
    rows = ck.checkpoint_rows(doc)
    assert [r[:4] for r in rows] == [
        ["local", "checkpoint-60", "60", "complete"],
        ["persistent", "generation-1/checkpoint-50", "50", "complete"],
        ["persistent", "generation-1/checkpoint-100", "100", "complete"],
        ["persistent", "checkpoint-5000", "5000", "complete"],
        ["persistent", "checkpoint-4000", "4000", "complete"],
        ["persistent", "checkpoint-3000", "3000", "complete"],
    ]
    assert rows[2][4] == "jit,resumed-from"
    assert [c.get("resumedFrom", False) for c in doc["checkpoints"]].count(True) == 1
    assert [c["generation"] for c in doc["checkpoints"]] == [1, 1, 1, 0, 0, 0]


def test_status_names_a_later_generations_checkpoint_with_its_generation() -> None:
    """`kubeckpt status` shows where the checkpoint lives: step 150 of generation 2 is not the
    earlier run's step 150, and a path that only looks like a generation is not one."""
    root = "/mnt/kubeckpt/team-a/llm"
    assert checkpoint_name(f"{root}/checkpoint-150") == "checkpoint-150"
    assert checkpoint_name(f"{root}/generation-2/checkpoint-150/") == "generation-2/checkpoint-150"
    assert checkpoint_name("s3://b/team-a/llm/generation-12/checkpoint-9") == (
        "generation-12/checkpoint-9"
    )
    assert checkpoint_name(f"{root}/generation-x/checkpoint-150") == "checkpoint-150"
    assert checkpoint_name("checkpoint-7") == "checkpoint-7"
    assert checkpoint_name("") is None
