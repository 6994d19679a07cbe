"""A replacement pod's restore and the victim's save in flight (trainer_runtime/handover.py).

The writer here is a thread or a child process of the test standing in for the pod being
replaced: `layout.begin` (the sentinel, and its heartbeat), files, then `layout.finalize`. The
replacement is the same sequence every restore runs: wait, remove leftovers, take the newest
complete checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainer_runtime import handover, heartbeat, layout
from trainer_runtime.contract import INCOMPLETE_SENTINEL, build_manifest, checkpoint_dir_name

REPO = Path(__file__).resolve().parents[3]


def commit(root: Path, step: int, *, delay: float = 0.0) -> None:
    path = layout.begin(root, step)
    (path / "model.bin").write_bytes(os.urandom(1024))
    time.sleep(delay)
    manifest = build_manifest(
        path, step=step, epoch=0, world_size=1, framework="test", tier="persistent",
        exclude=(INCOMPLETE_SENTINEL,),
    )  # fmt: skip
    layout.finalize(path, manifest)


def restore(root: Path) -> int | None:
    """What every restore does, in this order."""
    handover.wait_for_saves_in_flight(root, timeout=30)
    layout.remove_incomplete(root)
    complete = [e.step for e in layout.scan(root) if e.complete]
    return max(complete, default=None)


def slow_writer(root: Path, step: int, delay: float) -> tuple[threading.Thread, list]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            commit(root, step, delay=delay)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    while not (root / checkpoint_dir_name(step) / INCOMPLETE_SENTINEL).exists():
        time.sleep(0.01)
    return t, errors


def test_the_replacement_waits_for_the_save_in_flight_and_resumes_at_its_step(
    tmp_path: Path,
) -> None:
    commit(tmp_path, 10)
    # Longer than STALE_SECONDS: only the heartbeat keeps the writer alive that long.
    writer, errors = slow_writer(tmp_path, 20, delay=handover.STALE_SECONDS + 2)
    t0 = time.monotonic()
    step = restore(tmp_path)
    waited = time.monotonic() - t0
    writer.join()
    assert not errors
    assert step == 20
    assert waited >= handover.STALE_SECONDS


def test_without_the_wait_the_replacement_resumes_too_early_and_deletes_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What restore did before handover.py: it takes the older checkpoint, and its clean-up
    deletes the one the victim is still writing, whose commit then fails."""
    monkeypatch.setattr(handover, "wait_for_saves_in_flight", lambda *a, **k: [])
    commit(tmp_path, 10)
    writer, errors = slow_writer(tmp_path, 20, delay=1.0)
    assert restore(tmp_path) == 10
    writer.join()
    assert errors, "the victim's commit should have failed: its directory was deleted under it"
    assert not (tmp_path / checkpoint_dir_name(20)).exists()


def test_a_writer_that_died_is_not_waited_for_beyond_the_stale_time(tmp_path: Path) -> None:
    commit(tmp_path, 10)
    code = (
        "import os, sys; from trainer_runtime import layout; "
        "layout.begin(sys.argv[1], 20); os.kill(os.getpid(), 9)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, check=False)
    assert (tmp_path / checkpoint_dir_name(20) / INCOMPLETE_SENTINEL).exists()
    t0 = time.monotonic()
    assert restore(tmp_path) == 10
    assert time.monotonic() - t0 < handover.STALE_SECONDS + 2
    assert not (tmp_path / checkpoint_dir_name(20)).exists()


class SkewedWriter(threading.Thread):
    """A live writer on storage whose clock is `skew` seconds off the reader's (an NFS server
    stamps the sentinel's mtime with its own clock): it touches the sentinel every `interval`
    with that clock's time, then commits after `for_seconds`."""

    def __init__(self, root: Path, step: int, skew: float, for_seconds: float) -> None:
        super().__init__(daemon=True)
        self.root, self.step, self.skew, self.for_seconds = root, step, skew, for_seconds
        self.path = root / checkpoint_dir_name(step)
        self.path.mkdir(parents=True)
        self.sentinel = self.path / INCOMPLETE_SENTINEL
        self.sentinel.write_text("being written\n")
        self._touch()
        self.errors: list[BaseException] = []

    def _touch(self) -> None:
        t = time.time() + self.skew
        os.utime(self.sentinel, (t, t))

    def run(self) -> None:
        try:
            end = time.monotonic() + self.for_seconds
            while time.monotonic() < end:
                time.sleep(0.5)
                self._touch()
            (self.path / "model.bin").write_bytes(b"m" * 64)
            manifest = build_manifest(
                self.path, step=self.step, epoch=0, world_size=1, framework="test",
                tier="persistent",
            )  # fmt: skip
            layout.finalize(self.path, manifest)
        except BaseException as e:
            self.errors.append(e)


@pytest.mark.parametrize("skew", [-120.0, 120.0], ids=["server-2min-behind", "server-2min-ahead"])
def test_a_live_writer_is_waited_for_whatever_clock_stamps_its_sentinel(
    tmp_path: Path, skew: float
) -> None:
    """The sentinel's mtime is 2 minutes off the reader's clock while its writer is alive: the
    replacement still waits for it (its mtime changes), and resumes at its step."""
    commit(tmp_path, 10)
    writer = SkewedWriter(tmp_path, 20, skew, for_seconds=handover.STALE_SECONDS + 2)
    writer.start()
    t0 = time.monotonic()
    step = restore(tmp_path)
    waited = time.monotonic() - t0
    writer.join()
    assert not writer.errors
    assert step == 20
    assert waited >= handover.STALE_SECONDS


@pytest.mark.parametrize(
    "skew", [-120.0, 120.0, -86400.0], ids=["2min-behind", "2min-ahead", "a-day-old"]
)
def test_a_dead_writers_sentinel_is_taken_over_promptly_whatever_its_mtime(
    tmp_path: Path, skew: float
) -> None:
    """Left by a writer that died, its mtime anywhere on the reader's clock: the sentinel does
    not change, so the replacement stops waiting after STALE_SECONDS and cleans it up."""
    commit(tmp_path, 10)
    path = tmp_path / checkpoint_dir_name(20)
    path.mkdir()
    sentinel = path / INCOMPLETE_SENTINEL
    sentinel.write_text("left by a crash\n")
    t = time.time() + skew
    os.utime(sentinel, (t, t))
    t0 = time.monotonic()
    assert restore(tmp_path) == 10
    assert time.monotonic() - t0 < handover.STALE_SECONDS + 1.5
    assert not path.exists()


def test_the_wait_is_bounded(tmp_path: Path) -> None:
    commit(tmp_path, 10)
    hb = heartbeat.start(layout.begin(tmp_path, 20) / INCOMPLETE_SENTINEL)
    try:
        t0 = time.monotonic()
        assert handover.wait_for_saves_in_flight(tmp_path, timeout=1.5) == [20]
        assert 1.5 <= time.monotonic() - t0 < 3
    finally:
        hb.stop()


def test_a_save_in_flight_at_a_lower_step_is_waited_for_too(tmp_path: Path) -> None:
    """Step numbers do not order saves (a run resumed from an older checkpoint writes lower
    steps than the one it abandoned): a live writer below the newest complete step is waited
    for, and its checkpoint is not deleted as a leftover under it."""
    path = layout.begin(tmp_path, 5)  # beating, at a lower step than checkpoint-10
    commit(tmp_path, 10)
    result: list[list[int]] = []
    waiter = threading.Thread(
        target=lambda: result.append(handover.wait_for_saves_in_flight(tmp_path, timeout=30))
    )
    waiter.start()
    time.sleep(1.5)
    assert waiter.is_alive()  # still waiting for checkpoint-5's writer
    (path / "model.bin").write_bytes(b"m")
    manifest = build_manifest(
        path, step=5, epoch=0, world_size=1, framework="test", tier="persistent"
    )
    layout.finalize(path, manifest)
    waiter.join(5)
    assert result == [[5]]
    assert [e.step for e in layout.scan(tmp_path) if e.complete] == [5, 10]


def test_a_live_writer_in_another_generation_is_waited_for(tmp_path: Path) -> None:
    commit(tmp_path, 10)
    hb_path = layout.begin(layout.generation_dir(tmp_path, 1), 3)
    try:
        t0 = time.monotonic()
        assert handover.wait_for_saves_in_flight(tmp_path, timeout=1.5) == [3]
        assert time.monotonic() - t0 >= 1.5
    finally:
        layout.finalize(
            hb_path,
            build_manifest(
                hb_path, step=3, epoch=0, world_size=1, framework="t", tier="persistent"
            ),
        )


def test_the_bound_is_the_injected_grace() -> None:
    assert heartbeat.wait_timeout({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}) == 90
    assert heartbeat.wait_timeout({}) == heartbeat.DEFAULT_WAIT_SECONDS
    assert heartbeat.wait_timeout({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "x"}) == (
        heartbeat.DEFAULT_WAIT_SECONDS
    )


def test_the_writers_own_grace_lengthens_the_default_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The victim's grace was sized when it was created and may be longer than the
    replacement's: the sentinel carries it, and the default bound is the longer of the two."""
    commit(tmp_path, 10)
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "3")  # the writer's
    hb = heartbeat.start(layout.begin(tmp_path, 20) / INCOMPLETE_SENTINEL)
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "1")  # the reader's own
    try:
        t0 = time.monotonic()
        assert handover.wait_for_saves_in_flight(tmp_path) == [20]
        assert 3 <= time.monotonic() - t0 < 5
    finally:
        hb.stop()
