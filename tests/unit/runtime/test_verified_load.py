"""Restore reads the torch plain format's tensor shards once: their content is checked as they are
read into the model (plain.read_rank's `verify`), not in a separate pass before it. A bad byte
anywhere in a shard (a tensor, the zeros before an aligned one, past the end) is still found, and
named; under StartFresh the files are checked before the load, so step 0 starts untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trainer_runtime import layout
from trainer_runtime.contract import ContentMismatch, build_manifest, hash_file
from trainer_runtime.contract import manifest as manifest_module
from trainer_runtime.direct_write import ALIGN
from trainer_runtime.protocol.resume_outcome import ResumeRefused
from trainer_runtime.torch import CheckpointManager, plain


def _tree() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    # A small tensor first: the large ones after it start on a block boundary, with zeros between.
    return {
        "bias": torch.randn(3),
        "weight": torch.randn(ALIGN // 2, 3),
        "table": torch.randn(700, 9),
    }


def _written(tmp_path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Path, Any]:
    tree = _tree()
    plain.write_rank(tmp_path, 0, tree, {"step": 1})
    manifest = build_manifest(
        tmp_path, step=1, epoch=0, world_size=1, framework="torch", tier="persistent"
    )
    meta = plain.read_state(tmp_path, 0)
    shard = tmp_path / plain.tensors_file(0)
    return tree, meta, shard, manifest


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_verified_read_loads_every_tensor_in_place(tmp_path: Path) -> None:
    tree, meta, _, manifest = _written(tmp_path)
    targets = {k: torch.zeros_like(v) for k, v in tree.items()}
    back = plain.read_rank(tmp_path, 0, targets, meta, plain.shard_files(manifest, 0))
    for key, value in tree.items():
        assert torch.equal(back[key], value), key
        assert back[key].data_ptr() == targets[key].data_ptr(), "read into the live tensor"


@pytest.mark.parametrize("where", ["in a tensor", "in the zeros before an aligned tensor"])
def test_a_flipped_byte_is_found_where_the_plain_read_would_not_look(
    tmp_path: Path, where: str
) -> None:
    tree, meta, shard, manifest = _written(tmp_path)
    first = meta["index"][0]
    aligned = meta["index"][1]
    assert aligned["offset"] == ALIGN > first["offset"] + first["nbytes"], "a gap to flip"
    offset = aligned["offset"] + 17 if where == "in a tensor" else ALIGN - 5
    _flip(shard, offset)
    targets = {k: torch.zeros_like(v) for k, v in tree.items()}
    with pytest.raises(ContentMismatch) as caught:
        plain.read_rank(tmp_path, 0, targets, meta, plain.shard_files(manifest, 0))
    algorithm, expected = manifest.files[0].checksum
    found = hash_file(shard, algorithm)[1]
    assert caught.value.problems == (
        f"checksum mismatch: {shard.name}: expected {algorithm} {expected}, got {found}",
    )
    if where != "in a tensor":  # the gap holds no tensor: a read that does not verify loads fine
        back = plain.read_rank(tmp_path, 0, None, meta)
        assert all(torch.equal(back[k], v) for k, v in tree.items())


def test_bytes_past_the_last_tensor_are_a_size_mismatch(tmp_path: Path) -> None:
    _, meta, shard, manifest = _written(tmp_path)
    with open(shard, "ab") as f:
        f.write(b"\0")
    with pytest.raises(ContentMismatch, match=f"size mismatch: {shard.name}: expected"):
        plain.read_rank(tmp_path, 0, None, meta, plain.shard_files(manifest, 0))


def test_verify_checkpoint_leaves_deferred_content_to_the_loader_but_checks_its_size(
    tmp_path: Path,
) -> None:
    _, _, shard, manifest = _written(tmp_path)
    state = plain.state_file(0)
    layout.finalize(tmp_path, manifest)

    def deferred(m: Any) -> list[str]:
        return [shard.name]

    _flip(shard, 40)
    assert layout.verify_checkpoint(tmp_path, checksums=True, deferred=deferred)[1] == []
    assert "checksum mismatch" in layout.verify_checkpoint(tmp_path, checksums=True)[1][0]
    _flip(tmp_path / state, 60)  # not deferred: still hashed here
    problems = layout.verify_checkpoint(tmp_path, checksums=True, deferred=deferred)[1]
    assert [p.split(":")[0:2] for p in problems] == [["checksum mismatch", f" {state}"]]
    with open(shard, "ab") as f:
        f.write(b"\0")
    problems = layout.verify_checkpoint(tmp_path, checksums=True, deferred=deferred)[1]
    assert any(p.startswith(f"size mismatch: {shard.name}") for p in problems), problems


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(300, 300)
        self.b = nn.Linear(300, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _manager(root: Path, model: nn.Module, opt: torch.optim.Optimizer, **env: str):
    environ = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(root / "persistent"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "2",
        "CHECKPOINT_MAX_CHECKPOINTS": "3",
        "CHECKPOINT_JIT": "false",
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
        **env,
    }
    return CheckpointManager.from_env(model, opt, environ=environ)


def _fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _Model()
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train_and_save(root: Path, steps: int) -> dict[int, dict[str, torch.Tensor]]:
    """Checkpoints at steps 2, 4, ...; the model's parameters at each."""
    torch.manual_seed(1)
    model, opt = _fresh()
    saved = {}
    with _manager(root, model, opt) as mgr:
        assert mgr.restore() == 0
        for step in range(1, steps + 1):
            opt.zero_grad()
            model(torch.randn(8, 300)).square().mean().backward()
            opt.step()
            mgr.step_end(step)
            if step % 2 == 0:
                saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
    return saved


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files restore's verification pass hashes (from the disk, a second read)."""
    seen: list[str] = []
    real = manifest_module.hash_file

    def counting(path: Any, algorithm: str = "sha256") -> tuple[int, str]:
        seen.append(Path(path).name)
        return real(path, algorithm)

    monkeypatch.setattr(manifest_module, "hash_file", counting)
    return seen


def _corrupt(root: Path, step: int) -> Path:
    shard = root / "persistent" / f"checkpoint-{step}" / plain.tensors_file(0)
    _flip(shard, shard.stat().st_size // 2)
    return shard


def test_restore_reads_the_shards_once_and_loads_the_exact_state(
    tmp_path: Path, hashed: list[str]
) -> None:
    saved = _train_and_save(tmp_path, 4)
    model, opt = _fresh()
    with _manager(tmp_path, model, opt) as mgr:
        assert mgr.restore() == 4
    for key, value in saved[4].items():
        assert torch.equal(model.state_dict()[key], value), key
    assert plain.state_file(0) in hashed
    assert not [n for n in hashed if n.endswith(".tensors")], "hashed while loading, not before"


def test_a_corrupt_newest_checkpoint_loaded_in_part_gives_way_to_the_next_whole(
    tmp_path: Path,
) -> None:
    saved = _train_and_save(tmp_path, 6)
    _corrupt(tmp_path, 6)
    model, opt = _fresh()
    with _manager(tmp_path, model, opt) as mgr:
        assert mgr.restore() == 4
    for key, value in saved[4].items():
        assert torch.equal(model.state_dict()[key], value), key


def test_when_none_verifies_the_process_stops_naming_each_file(tmp_path: Path) -> None:
    _train_and_save(tmp_path, 4)
    bad = [_corrupt(tmp_path, 2), _corrupt(tmp_path, 4)]
    model, opt = _fresh()
    with pytest.raises(ResumeRefused) as caught, _manager(tmp_path, model, opt) as mgr:
        mgr.restore()
    message = str(caught.value)
    assert "none of 2 checkpoints verifies" in message
    for shard in bad:
        assert f"{shard.parent}: checksum mismatch: {shard.name}" in message


def test_start_fresh_checks_before_loading_so_step_0_starts_untouched(
    tmp_path: Path, hashed: list[str]
) -> None:
    _train_and_save(tmp_path, 4)
    _corrupt(tmp_path, 2)
    _corrupt(tmp_path, 4)
    torch.manual_seed(5)
    model, opt = _fresh()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with _manager(tmp_path, model, opt, CHECKPOINT_ON_UNVERIFIABLE="StartFresh") as mgr:
        assert mgr.restore() == 0
    for key, value in initial.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert hashed.count(plain.tensors_file(0)) == 2, "both shards hashed before any load"
