"""The stdlib-only core: configuration, schedule, step timer, progress writer, layout protocol."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.import_graph import core_modules
from trainer_runtime import layout
from trainer_runtime.config import Config
from trainer_runtime.contract import (
    INCOMPLETE_SENTINEL,
    ContractError,
    RuntimeSettings,
    build_manifest,
    parse_progress,
    write_manifest_atomic,
)
from trainer_runtime.progress_writer import ProgressWriter
from trainer_runtime.storage import LocalTier, S3Tier, StorageError, persistent_tier
from trainer_runtime.timing import Schedule, StepTimer

REPO = Path(__file__).resolve().parents[3]


def test_core_imports_only_the_standard_library() -> None:
    """Every core module (tests/support/import_graph.py: all but torch/, hf/, jax/ and what
    imports them), imported for real, loads nothing from outside the standard library."""
    named = [
        "trainer_runtime",
        "trainer_runtime.config",
        "trainer_runtime.layout",
        "trainer_runtime.progress_writer",
        "trainer_runtime.prestop",
        "trainer_runtime.storage",
        "trainer_runtime.timing",
        "trainer_runtime.stop.triggers",
        "trainer_runtime.fsutil",
    ]
    core = core_modules()
    assert set(named) <= set(core)
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"for name in {core!r}: __import__(name)\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "bad = sorted(new - set(sys.stdlib_module_names) - {'trainer_runtime'})\n"
        "bad += sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'torch', 'numpy', 'fsspec', 's3fs', 'botocore', 'aiobotocore'})\n"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# --- config -------------------------------------------------------------------------------


def test_config_defaults_match_the_contract() -> None:
    cfg = Config.from_env({})
    assert cfg.settings == RuntimeSettings()
    assert not cfg.enabled and cfg.async_save and cfg.verify_checksums == "auto"
    assert cfg.termination_log == "/dev/termination-log"


def test_config_env_and_overrides() -> None:
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": "s3://b/p",
        "CHECKPOINT_INTERVAL": "10m",
        "KUBECKPT_ASYNC_SAVE": "false",
        "KUBECKPT_VERIFY_CHECKSUMS": "Never",
        "KUBECKPT_LOCAL_KEEP": "2",
    }
    cfg = Config.from_env(env, max_checkpoints=5, termination_log="/tmp/x")
    assert cfg.settings.checkpoint_interval == 600 and cfg.settings.max_checkpoints == 5
    assert not cfg.async_save and cfg.verify_checksums == "never" and cfg.local_keep == 2
    assert cfg.termination_log == "/tmp/x" and cfg.is_remote
    assert not cfg.should_verify_checksums(1)
    # "auto" verifies content at every size (issue 17); only "never" opts out.
    assert Config.from_env({}).should_verify_checksums(10**6)
    assert Config.from_env({}).should_verify_checksums(10**12)
    assert Config.from_env({"KUBECKPT_VERIFY_CHECKSUMS": "always"}).should_verify_checksums(1)


@pytest.mark.parametrize(
    ("env", "overrides"),
    [
        ({"KUBECKPT_ASYNC_SAVE": "maybe"}, {}),
        ({"KUBECKPT_VERIFY_CHECKSUMS": "sometimes"}, {}),
        ({"KUBECKPT_LOCAL_KEEP": "0"}, {}),
        ({"CHECKPOINT_ENABLED": "true"}, {}),  # no URI
        ({}, {"max_checkpoints": 0}),
    ],
)
def test_config_rejects_bad_values(env: dict[str, str], overrides: dict) -> None:
    with pytest.raises(ContractError):
        Config.from_env(env, **overrides)


def test_config_rejects_unknown_override() -> None:
    with pytest.raises(TypeError, match="unknown configuration keys: nope"):
        Config.from_env({}, nope=1)


# --- schedule and timer -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_schedule_strategies() -> None:
    base = {"checkpoint_enabled": True, "checkpoint_uri": "/x"}
    steps = Schedule(
        RuntimeSettings(**base, checkpoint_strategy="steps", checkpoint_save_steps=4),
        local_enabled=True,
    )
    assert [s for s in range(1, 13) if steps.decide(s).persistent] == [4, 8, 12]
    assert [s for s in range(1, 301) if steps.decide(s).local] == [100, 200, 300]
    epoch = Schedule(RuntimeSettings(**base, checkpoint_strategy="epoch"), local_enabled=False)
    assert not epoch.decide(5).persistent and epoch.decide(5, end_of_epoch=True).persistent
    clock = Clock()
    timed = Schedule(
        RuntimeSettings(**base, checkpoint_interval=60), local_enabled=False, clock=clock
    )
    clock.now = 59.9
    assert not timed.decide(1).persistent
    clock.now = 60.0
    assert timed.decide(2).persistent
    timed.restart_interval()
    assert not timed.decide(3).persistent
    off = Schedule(
        RuntimeSettings(checkpoint_strategy="steps", checkpoint_save_steps=1), local_enabled=True
    )
    assert off.decide(1) == off.decide(100)  # disabled: never due


def test_step_timer_smooths_and_skips_warmup() -> None:
    clock = Clock()
    timer = StepTimer(alpha=0.5, clock=clock)
    timer.observe(0)
    clock.now = 30.0  # the first interval (start-up) is ignored
    timer.observe(1)
    assert timer.step_seconds is None
    clock.now = 32.0
    timer.observe(2)
    assert timer.step_seconds == 2.0
    clock.now = 36.0
    timer.observe(3)
    assert timer.step_seconds == 3.0
    assert timer.eta_seconds(3, 13) == 30.0
    assert timer.eta_seconds(3, None) is None


# --- progress writer ----------------------------------------------------------------------


def test_progress_writer_writes_valid_records(tmp_path: Path) -> None:
    path = tmp_path / "run" / "progress.json"
    term = tmp_path / "termination-log"
    w = ProgressWriter(
        str(path), enabled=True, every=5, total_steps=300, total_epochs=3,
        checkpointing_enabled=True, termination_log=str(term),
    )  # fmt: skip
    assert [s for s in range(1, 16) if w.due(s)] == [5, 10, 15]
    w.resumed_from = "checkpoint-100"
    w.checkpoint_saved("/mnt/x/checkpoint-150", save_seconds=2.1, stall_seconds=0.08)
    record = w.build(150, epoch=2, loss=0.45231, learning_rate=5e-5, step_seconds=1.82,
                     eta_seconds=2730, metrics={"validationLoss": 0.5, "bogus": 1})  # fmt: skip
    assert w.write(record)
    data = json.loads(path.read_text())
    assert data["step"] == 150 and data["percentComplete"] == "50.0"
    assert data["loss"] == "0.4523" and data["learningRate"] == "0.000050"
    assert data["estimatedTimeRemaining"] == "45m30s" and data["stepSeconds"] == "1.820"
    assert data["resumedFrom"] == "checkpoint-100" and data["validationLoss"] == "0.5000"
    assert data["checkpointing"]["checkpointsCreated"] == 1
    assert data["checkpointing"]["lastSaveSeconds"] == "2.100"
    assert parse_progress(path.read_bytes()).step == 150
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]  # no temp files left
    w.write_final()
    assert parse_progress(term.read_bytes()).step == 150
    assert len(term.read_bytes()) <= 4096


def test_progress_writer_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    w = ProgressWriter(str(blocker / "progress.json"), enabled=True, every=1,
                       termination_log=str(blocker / "log"))  # fmt: skip
    record = w.build(1, loss=float("nan"))
    assert record.loss is None  # NaN is not a decimal: left out rather than failing
    assert not w.write(record)
    w.write_final(record)  # logs, does not raise


def test_progress_writer_disabled_on_other_ranks(tmp_path: Path) -> None:
    w = ProgressWriter(str(tmp_path / "p.json"), enabled=False, every=1)
    assert not w.due(1) and not w.write(w.build(1))
    assert not (tmp_path / "p.json").exists()


# --- layout -------------------------------------------------------------------------------


def _complete(root: Path, step: int, payload: bytes = b"data") -> Path:
    path = layout.begin(root, step)
    (path / "shard").write_bytes(payload)
    manifest = build_manifest(
        path, step=step, epoch=0, world_size=1, framework="test", tier="persistent"
    )
    layout.finalize(path, manifest)
    return path


def test_layout_protocol_states(tmp_path: Path) -> None:
    path = layout.begin(tmp_path, 7)
    assert sorted(p.name for p in path.iterdir()) == [INCOMPLETE_SENTINEL]
    assert layout.scan(tmp_path) == [layout.Entry(7, False)]
    (path / "shard").write_bytes(b"abc")
    manifest = build_manifest(
        path, step=7, epoch=0, world_size=1, framework="test", tier="persistent"
    )
    write_manifest_atomic(path, manifest)  # crash here: manifest and sentinel both present
    assert layout.scan(tmp_path) == [layout.Entry(7, False)]
    layout.finalize(path, manifest)
    assert layout.scan(tmp_path) == [layout.Entry(7, True)]
    assert layout.verify_checkpoint(path, checksums=True)[1] == []


def test_layout_begin_replaces_a_stale_directory(tmp_path: Path) -> None:
    stale = tmp_path / "checkpoint-3"
    stale.mkdir()
    (stale / "old-shard").write_bytes(b"old")
    path = layout.begin(tmp_path, 3)
    assert sorted(p.name for p in path.iterdir()) == [INCOMPLETE_SENTINEL]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-3"]  # trash removed too


def test_layout_verify_finds_problems(tmp_path: Path) -> None:
    path = _complete(tmp_path, 1, b"0123456789")
    (path / "shard").write_bytes(b"0123456780")
    manifest, problems = layout.verify_checkpoint(path, checksums=True)
    assert manifest is not None and problems and "checksum mismatch: shard" in problems[0]
    assert layout.verify_checkpoint(path, checksums=False)[1] == []
    assert layout.verify_checkpoint(path, checksums=lambda size: size > 100)[1] == []
    (path / "shard").write_bytes(b"short")
    assert "size mismatch" in layout.verify_checkpoint(path, checksums=False)[1][0]
    (path / "manifest.json").write_text("{not json")
    manifest, problems = layout.verify_checkpoint(path, checksums=False)
    assert manifest is None and "unreadable manifest" in problems[0]


def test_layout_cleanup_and_retention(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        _complete(tmp_path, step)
    layout.begin(tmp_path, 40)  # in progress
    (tmp_path / "checkpoint-0100").mkdir()  # not canonical: not ours, left alone
    (tmp_path / ".kubeckpt-trash-checkpoint-5-abcd").mkdir()  # an interrupted deletion
    assert layout.retain(tmp_path, 2) == [10]
    assert layout.remove_incomplete(tmp_path) == [40]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-0100",
        "checkpoint-20",
        "checkpoint-30",
    ]


def test_tier_selection_from_uri(tmp_path: Path) -> None:
    assert isinstance(persistent_tier(str(tmp_path), "/s"), LocalTier)
    tier = persistent_tier(f"file://{tmp_path}", "/s")
    assert isinstance(tier, LocalTier) and tier.root == str(tmp_path)
    with pytest.raises(StorageError, match="gs:// is not supported"):
        persistent_tier("gs://b/p", "/s")


def test_s3_tier_without_fsspec_says_how_to_fix(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['fsspec'] = None\n"
        "from trainer_runtime.storage import persistent_tier, StorageError\n"
        "try:\n    persistent_tier('s3://b/p', '/tmp/s')\n"
        "except StorageError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "pip install 'kubeckpt[s3]'" in out.stdout
    assert S3Tier  # the class itself imports without fsspec


def test_local_tier_discard_and_fetch(tmp_path: Path) -> None:
    tier = LocalTier(tmp_path, "local")
    assert not tier.shared
    path = tier.begin(5)
    assert tier.fetch(5) == path == tier.write_dir(5)
    tier.discard(5)
    assert not path.exists() and os.listdir(tmp_path) == []
