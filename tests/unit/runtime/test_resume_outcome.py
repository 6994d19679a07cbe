"""Checkpoints that exist but none of which verifies (issue 27 item 4): the pure decision
(trainer_runtime/protocol/resume_outcome.py) and the Checkpointer acting on it over simulated
ranks (tests/support/toy_ranks.py): the process stops with UNVERIFIABLE_EXIT_CODE naming the bad
checkpoints, or starts fresh with a warning when CHECKPOINT_ON_UNVERIFIABLE=StartFresh; a manifest
of an unknown format version stops it with UNSUPPORTED_FORMAT_EXIT_CODE whatever the setting."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.support.simulated_ranks import run_ranks
from tests.support.toy_ranks import Job, ToyLoader, ToySave
from trainer_runtime.contract import MANIFEST_FILE, ContractError, RuntimeSettings, parse_progress
from trainer_runtime.contract.env import UNSUPPORTED_FORMAT_EXIT_CODE, UNVERIFIABLE_EXIT_CODE
from trainer_runtime.contract.progress import UNVERIFIABLE_CHECKPOINTS
from trainer_runtime.protocol.resume_outcome import (
    UNLOADABLE,
    UNSUPPORTED,
    UNVERIFIED,
    Action,
    Rejected,
    ResumeOutcome,
    ResumeRefused,
    decide_resume,
)

BAD = Rejected("/ckpt/checkpoint-4", UNVERIFIED, ("checksum mismatch: rank-0.json: expected x",))
OLDER_BAD = Rejected("/ckpt/checkpoint-2", UNVERIFIED, ("missing file: rank-0.json",))


# --- the pure decision ---------------------------------------------------------------------------


def test_none_verifies_fails_by_default_naming_each_checkpoint_and_why() -> None:
    d = decide_resume(ResumeOutcome(None, (BAD, OLDER_BAD)), "Fail")
    assert d.action is Action.FAIL and d.exit_code == UNVERIFIABLE_EXIT_CODE
    assert d.reason == "CheckpointsUnverifiable" and d.rejected == (BAD, OLDER_BAD)
    assert "none of 2 checkpoints verifies" in d.message
    assert "/ckpt/checkpoint-4: checksum mismatch: rank-0.json" in d.message
    assert "/ckpt/checkpoint-2: missing file: rank-0.json" in d.message


def test_none_verifies_starts_fresh_with_a_warning_when_the_policy_says_so() -> None:
    d = decide_resume(ResumeOutcome(None, (BAD,)), "StartFresh")
    assert d.action is Action.START_FRESH and d.exit_code is None
    assert d.reason == "CheckpointsUnverifiable"
    assert d.message.startswith("none of 1 checkpoint verifies, starting from step 0")


def test_some_verify_resumes_from_the_newest_good_one_whatever_the_setting() -> None:
    for setting in ("Fail", "StartFresh"):
        d = decide_resume(ResumeOutcome(2, (BAD,)), setting)
        assert d.action is Action.RESUME and d.reason is None
        assert "newer checkpoints were skipped: /ckpt/checkpoint-4" in d.message


def test_no_checkpoint_at_all_starts_fresh_quietly() -> None:
    d = decide_resume(ResumeOutcome(None, ()), "Fail")
    assert (d.action, d.message, d.reason) == (Action.START_FRESH, "", None)


def test_only_unloadable_ones_start_fresh_as_before() -> None:
    """Verified but not loadable by this model (another architecture): not the corrupt-store
    case; restore starts fresh as it did (the rejection is kept in the decision)."""
    unloadable = Rejected("/ckpt/checkpoint-4", UNLOADABLE, ("KeyError: 'w'",))
    d = decide_resume(ResumeOutcome(None, (unloadable,)), "Fail")
    assert d.action is Action.START_FRESH and d.rejected == (unloadable,)


def test_an_unknown_format_version_fails_asking_for_an_upgrade_whatever_the_setting() -> None:
    newer = Rejected("/ckpt/checkpoint-9", UNSUPPORTED, ("formatVersion: unsupported version 3",))
    for outcome in (ResumeOutcome(None, (newer,)), ResumeOutcome(None, (BAD, newer))):
        for setting in ("Fail", "StartFresh"):
            d = decide_resume(outcome, setting)
            assert d.action is Action.FAIL and d.exit_code == UNSUPPORTED_FORMAT_EXIT_CODE
            assert "upgrade the runtime image" in d.message and "version 3" in d.message
            assert d.rejected == (newer,)  # not counted as a bad checkpoint


def test_the_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="onUnverifiableCheckpoints"):
        decide_resume(ResumeOutcome(None, ()), "fail")
    with pytest.raises(ContractError, match="CHECKPOINT_ON_UNVERIFIABLE: must be one of"):
        RuntimeSettings.from_env({"CHECKPOINT_ON_UNVERIFIABLE": "Maybe"})
    s = RuntimeSettings.from_env({"CHECKPOINT_ON_UNVERIFIABLE": "StartFresh"})
    assert s.on_unverifiable == "StartFresh"
    assert RuntimeSettings.from_env(s.to_env()) == s
    assert RuntimeSettings.from_env({}).on_unverifiable == "Fail"
    assert "CHECKPOINT_ON_UNVERIFIABLE" not in RuntimeSettings().to_env()  # only when set


# --- the Checkpointer acting on it (simulated ranks) ---------------------------------------------


def _write_checkpoints(j: Job, steps: list[int]) -> None:
    def rank(r: int) -> None:
        ckpt = j.ckpts[r]
        ckpt.restore(ToyLoader(r))
        for step in steps:
            ckpt.save(step, lambda s=step: ToySave(r, [s, r]), blocking=True)
        ckpt.close()

    run_ranks(j.n, rank)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[1] ^= 0x01  # same size: only the content hash tells
    path.write_bytes(bytes(data))


def _restore_all(j: Job) -> list[object]:
    """What each rank's restore did: the step it resumed, None, or the ResumeRefused raised."""

    def rank(r: int) -> object:
        try:
            restored = j.ckpts[r].restore(ToyLoader(r))
        except ResumeRefused as e:
            return e
        return restored.step if restored is not None else None

    return run_ranks(j.n, rank)


def test_a_store_of_only_corrupt_checkpoints_stops_every_rank_and_tells_the_controller(
    job, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    _write_checkpoints(job(2), [2, 4])
    _flip_a_byte(root / "checkpoint-4" / "rank-1.json")
    (root / "checkpoint-2" / "rank-0.json").unlink()
    with caplog.at_level(logging.ERROR, "trainer_runtime"):
        results = _restore_all(job(2))
    assert all(isinstance(e, ResumeRefused) for e in results)
    assert {e.code for e in results} == {UNVERIFIABLE_EXIT_CODE}  # type: ignore[attr-defined]
    message = str(results[0])
    assert "none of 2 checkpoints verifies; not starting from step 0" in message
    assert f"{root}/checkpoint-4: checksum mismatch: rank-1.json" in message
    assert f"{root}/checkpoint-2: missing file: rank-0.json" in message
    assert message in caplog.text
    # Rank 0 told the controller: the progress file and the termination message name them.
    for text in (
        (tmp_path / "progress.json").read_text(),
        (tmp_path / "termination-0").read_text(),
    ):
        named = parse_progress(text).checkpointing.extra[UNVERIFIABLE_CHECKPOINTS]
        assert named["reason"] == "CheckpointsUnverifiable"
        assert "checkpoint-4: checksum mismatch: rank-1.json" in named["message"]
    # Nothing was deleted: the bad checkpoints stay for inspection.
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_start_fresh_when_the_policy_allows_it_with_a_warning(
    job, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ckpt"
    _write_checkpoints(job(1), [2])
    _flip_a_byte(root / "checkpoint-2" / "rank-0.json")
    with caplog.at_level(logging.WARNING, "trainer_runtime"):
        fresh = job(1, CHECKPOINT_ON_UNVERIFIABLE="StartFresh")
        assert _restore_all(fresh) == [None]
    assert "none of 1 checkpoint verifies, starting from step 0" in caplog.text
    # The controller hears of it too, from the next record (condition reason StartedFresh).
    named = fresh.ckpts[0].progress.build(0).checkpointing.extra[UNVERIFIABLE_CHECKPOINTS]
    assert named["reason"] == "StartedFresh" and "checkpoint-2" in named["message"]


def test_a_good_older_checkpoint_is_resumed_past_a_corrupt_newer_one(job, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    _write_checkpoints(job(2), [2, 4])
    _flip_a_byte(root / "checkpoint-4" / "rank-0.json")
    assert _restore_all(job(2)) == [2, 2]


def test_a_newer_format_version_stops_the_run_and_is_not_taken_for_corrupt(
    job, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    _write_checkpoints(job(1), [2, 4])
    manifest = root / "checkpoint-4" / MANIFEST_FILE
    data = json.loads(manifest.read_text())
    data["formatVersion"] = 3
    manifest.write_text(json.dumps(data))
    # An older good checkpoint exists, and StartFresh is set: neither is used over a newer one.
    [refused] = _restore_all(job(1, CHECKPOINT_ON_UNVERIFIABLE="StartFresh"))
    assert isinstance(refused, ResumeRefused) and refused.code == UNSUPPORTED_FORMAT_EXIT_CODE
    assert "unsupported version 3" in str(refused) and "upgrade the runtime image" in str(refused)
