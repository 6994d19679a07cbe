"""A replacement pod's restore and the victim's save in flight on s3:// (issue 28), against the
session's SeaweedFS (tests/conftest.py `seaweedfs`): the writer re-uploads its sentinel every
second with a changing body (heartbeat.py), and restore waits while its ETag changes
(storage.S3Sentinels, handover.py).

The victim is a thread or a child process with an S3Tier of its own (its own s3fs client): begin
(the sentinel, and its beat), its files, then the manifest and the sentinel's removal. The
replacement runs what every restore runs (trainer_runtime/protocol/resume.py): wait, remove
leftovers, list the complete checkpoints newest first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trainer_runtime import handover, heartbeat
from trainer_runtime.contract import INCOMPLETE_SENTINEL, MANIFEST_FILE, build_manifest
from trainer_runtime.protocol import resume
from trainer_runtime.protocol.agreement import Solo
from trainer_runtime.protocol.commit import Member
from trainer_runtime.storage import S3Sentinels, S3Tier

REPO = Path(__file__).resolve().parents[3]


def tier_at(uri: str, staging: Path) -> S3Tier:
    return S3Tier(uri, staging)  # its own s3fs client: another pod


def commit(tier: S3Tier, step: int, *, delay: float = 0.0) -> None:
    d = tier.begin(step)
    (d / "model.bin").write_bytes(b"m" * 1024)
    tier.publish(step, ["model.bin"])
    time.sleep(delay)
    manifest = build_manifest(d, step=step, epoch=0, world_size=1, framework="test", tier=tier.name)
    tier.commit(step, manifest)
    tier.release(step)


def restore(tier: S3Tier) -> int | None:
    """What every restore does (resume.remove_incomplete, then resume.candidates): the step it
    resumes from."""
    io, me = Solo(), Member()
    resume.remove_incomplete(io, me, tier, None)
    found = resume.candidates(io, me, tier, None, lambda t, s: False)
    return found[0].step if found else None


def objects(tier: S3Tier, step: int) -> list[str]:
    tier.fs.invalidate_cache()
    try:
        keys = tier.fs.find(tier._key(step))
    except FileNotFoundError:
        return []
    return sorted(k.rsplit("/", 1)[1] for k in keys)


def slow_writer(tier: S3Tier, step: int, delay: float) -> tuple[threading.Thread, list]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            commit(tier, step, delay=delay)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    while not tier.fs.exists(tier._key(step, "model.bin")):  # uploaded: the commit is next
        time.sleep(0.01)
    return t, errors


@pytest.fixture
def victim_and_replacement(s3_root: tuple[Any, str], tmp_path: Path) -> tuple[S3Tier, S3Tier]:
    _, uri = s3_root
    victim = tier_at(uri, tmp_path / "victim")
    commit(victim, 10)  # the periodic checkpoint before the save in flight
    return victim, tier_at(uri, tmp_path / "replacement")


def test_the_replacement_waits_for_the_upload_in_flight_and_resumes_at_its_step(
    victim_and_replacement: tuple[S3Tier, S3Tier],
) -> None:
    victim, replacement = victim_and_replacement
    # Longer than STALE_SECONDS: only the heartbeat keeps the writer alive that long.
    writer, errors = slow_writer(victim, 20, delay=handover.STALE_SECONDS + 2)
    t0 = time.monotonic()
    step = restore(replacement)
    waited = time.monotonic() - t0
    writer.join()
    assert not errors
    assert step == 20  # the newer checkpoint, not checkpoint-10
    assert waited >= handover.STALE_SECONDS
    assert objects(replacement, 20) == [MANIFEST_FILE, "model.bin"]  # not deleted as a leftover
    assert objects(replacement, 10) == [MANIFEST_FILE, "model.bin"]


def test_without_the_wait_the_replacement_resumes_too_early_and_deletes_the_upload(
    victim_and_replacement: tuple[S3Tier, S3Tier], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What restore did on s3:// before (issue 28): it takes the older checkpoint, and its
    clean-up deletes the one being uploaded; the victim's commit then leaves a manifest whose
    files are gone."""
    victim, replacement = victim_and_replacement
    monkeypatch.setattr(handover, "wait_for_saves_in_flight", lambda *a, **k: [])
    writer, _ = slow_writer(victim, 20, delay=1.0)
    assert restore(replacement) == 10
    writer.join()  # its commit may fail (the sentinel gone) or not (a beat put it back)
    assert objects(replacement, 20) == [MANIFEST_FILE]


def test_the_sentinel_beats_while_the_upload_runs_and_is_gone_for_good_after(
    s3_root: tuple[Any, str], tmp_path: Path
) -> None:
    """The writer's side: the sentinel's ETag changes every HEARTBEAT_SECONDS and its body is the
    owner record with a counter; after the commit (and after a discard) no beat brings it
    back, or the committed checkpoint would read as incomplete."""
    _, uri = s3_root
    tier = tier_at(uri, tmp_path)
    sentinels = S3Sentinels(tier)
    d = tier.begin(5)
    [key] = sentinels.pending().values()
    tokens = [sentinels.token(key)]
    for _ in range(3):
        time.sleep(heartbeat.HEARTBEAT_SECONDS + 0.2)
        tokens.append(sentinels.token(key))
    assert None not in tokens and len(set(tokens)) == len(tokens), tokens
    record = json.loads(sentinels.record(key))
    assert record["writer"] == "kubeckpt" and record["beat"] >= 3
    assert record["graceSeconds"] == heartbeat.wait_timeout()
    (d / "model.bin").write_bytes(b"m")
    tier.publish(5, ["model.bin"])
    tier.commit(
        5, build_manifest(d, step=5, epoch=0, world_size=1, framework="t", tier="persistent")
    )
    assert not [t for t in threading.enumerate() if t.name == "kubeckpt-heartbeat:checkpoint-5"]
    tier.begin(6)
    tier.discard(6)
    time.sleep(2 * heartbeat.HEARTBEAT_SECONDS + 0.5)
    assert objects(tier, 5) == [MANIFEST_FILE, "model.bin"]
    assert objects(tier, 6) == []
    assert [(e.step, e.complete) for e in tier.scan()] == [(5, True)]


def test_a_writer_that_died_is_given_up_on_after_the_stale_time_and_cleaned_up(
    victim_and_replacement: tuple[S3Tier, S3Tier], tmp_path: Path
) -> None:
    victim, replacement = victim_and_replacement
    code = (
        "import os, sys; from trainer_runtime.storage import S3Tier; "
        "S3Tier(sys.argv[1], sys.argv[2]).begin(20); os.kill(os.getpid(), 9)"
    )
    subprocess.run(
        [sys.executable, "-c", code, victim.uri, str(tmp_path / "dead")], cwd=REPO, check=False
    )
    assert objects(replacement, 20) == [INCOMPLETE_SENTINEL]
    t0 = time.monotonic()
    assert restore(replacement) == 10
    assert time.monotonic() - t0 < handover.STALE_SECONDS + 2
    assert objects(replacement, 20) == []


def test_the_wait_is_bounded(victim_and_replacement: tuple[S3Tier, S3Tier]) -> None:
    victim, replacement = victim_and_replacement
    victim.begin(20)  # beats until discarded
    try:
        t0 = time.monotonic()
        assert handover.wait_for_saves_in_flight(replacement.sentinels(), timeout=1.5) == [20]
        assert 1.5 <= time.monotonic() - t0 < 3
    finally:
        victim.discard(20)


def test_the_bound_is_lengthened_by_the_writers_grace_in_its_sentinel(
    victim_and_replacement: tuple[S3Tier, S3Tier], monkeypatch: pytest.MonkeyPatch
) -> None:
    victim, replacement = victim_and_replacement
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "3")  # the writer's
    victim.begin(20)
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "1")  # the reader's own
    try:
        t0 = time.monotonic()
        assert handover.wait_for_saves_in_flight(replacement.sentinels()) == [20]
        assert 3 <= time.monotonic() - t0 < 5
    finally:
        victim.discard(20)


class HostileWriter(threading.Thread):
    """A writer that is not kubeckpt's runtime: it re-uploads the sentinel every 0.5 s with a
    1 MiB body that is not JSON (different bytes each time), then commits after `for_seconds`."""

    def __init__(self, tier: S3Tier, step: int, for_seconds: float) -> None:
        super().__init__(daemon=True)
        self.tier, self.step, self.for_seconds = tier, step, for_seconds
        self.key = tier._key(step, INCOMPLETE_SENTINEL)
        self.errors: list[BaseException] = []
        self._put(0)

    def _put(self, n: int) -> None:
        self.tier.fs.pipe(self.key, bytes([n % 256]) * (1 << 20))

    def run(self) -> None:
        try:
            end, n = time.monotonic() + self.for_seconds, 0
            while time.monotonic() < end:
                time.sleep(0.5)
                n += 1
                self._put(n)
            d = self.tier.write_dir(self.step)
            d.mkdir(parents=True, exist_ok=True)
            (d / "model.bin").write_bytes(b"h" * 64)
            self.tier.publish(self.step, ["model.bin"])
            manifest = build_manifest(
                d, step=self.step, epoch=0, world_size=1, framework="t", tier="persistent"
            )
            self.tier.commit(self.step, manifest)
        except BaseException as e:
            self.errors.append(e)


def test_hostile_sentinel_bodies_do_not_break_the_wait(
    victim_and_replacement: tuple[S3Tier, S3Tier], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A huge, non-JSON sentinel that keeps changing is a live writer, followed to its commit (its
    body read only up to RECORD_BYTES, for a grace it does not give); a huge one that does not
    change (garbage left behind) is given up on after STALE_SECONDS and cleaned up."""
    victim, replacement = victim_and_replacement
    read: list[int] = []
    cat_file = replacement.fs.cat_file

    def spy(path: str, *a: Any, **k: Any) -> bytes:
        data = cat_file(path, *a, **k)
        if path.endswith(INCOMPLETE_SENTINEL):
            read.append(len(data))
        return data

    monkeypatch.setattr(replacement.fs, "cat_file", spy)
    writer = HostileWriter(victim, 20, for_seconds=handover.STALE_SECONDS + 2)
    victim.fs.pipe(victim._key(30, INCOMPLETE_SENTINEL), b"\xff{" * (1 << 19))  # left behind
    writer.start()
    t0 = time.monotonic()
    step = restore(replacement)
    waited = time.monotonic() - t0
    writer.join()
    assert not writer.errors
    assert step == 20
    assert waited >= handover.STALE_SECONDS
    assert read and max(read) <= handover.RECORD_BYTES, read
    assert objects(replacement, 30) == []
    assert objects(replacement, 20) == [MANIFEST_FILE, "model.bin"]
