"""The framework-neutral save protocol (trainer_runtime.protocol) and the just-in-time stop on it
(trainer_runtime.stop) with N simulated ranks: threads of one process, a collective over a
barrier, no torch. The "framework" is a toy (tests/support/toy_ranks.py): each rank's state is a
list of integers written to its own file."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.simulated_ranks import SimulatedGroup, run_ranks
from tests.support.toy_ranks import ToyLoader, ToySave
from trainer_runtime import layout
from trainer_runtime.contract import (
    MANIFEST_REASON,
    REASON_JIT,
    REASON_PERIODIC,
    checkpoint_dir_name,
    read_manifest,
)
from trainer_runtime.protocol import Pipelined, Solo
from trainer_runtime.stop import JitStop


def _train(stop: JitStop, rank: int, steps: range, **save_kw: Any) -> int | None:
    """A toy loop: the state at step s is [s, rank]; returns the step it stopped at, if any."""
    ckpt = stop.ckpt
    for step in steps:
        d = stop.decide(step)
        if d.stop:
            stop.save_at(step, lambda s=step: ToySave(rank, [s, rank]))
            return step
        if d.persistent or d.local:
            ckpt.save(
                step,
                lambda s=step: ToySave(rank, [s, rank]),
                persistent=d.persistent,
                local=d.local,
                **save_kw,
            )
    ckpt.session.wait()
    return None


def test_pipelined_answer_lands_one_call_later() -> None:
    group = SimulatedGroup(2)

    def rank(r: int) -> list[Any]:
        p = Pipelined(group.member(r))
        return [p.exchange([r == 1 and i == 1, 0]) for i in range(3)] + [p.collect()]

    a, b = run_ranks(2, rank)
    assert a == b == [None, [0, 0], [1, 0], [0, 0]]
    assert Pipelined(Solo()).exchange([1, 0]) == [1, 0]  # a single process answers at once


def test_every_rank_reports_its_files_and_the_manifest_lists_them(job, tmp_path: Path) -> None:
    j = job(3)
    run_ranks(3, lambda r: _train(j.stops[r], r, range(1, 7)))
    root = tmp_path / "ckpt"
    assert [(e.step, e.complete) for e in layout.scan(root)] == [(4, True), (6, True)]  # keep 2
    manifest = layout.verify_checkpoint(root / "checkpoint-6", checksums=True)
    assert manifest[1] == []
    assert [f.path for f in manifest[0].files] == [f"rank-{r}.json" for r in range(3)]
    assert manifest[0].world_size == 3 and manifest[0].framework == "toy"
    assert manifest[0].extra[MANIFEST_REASON] == REASON_PERIODIC  # `kubeckpt checkpoints` shows it
    record = j.ckpts[0].progress.checkpointing.to_dict()  # rank 0's, for the progress file
    assert record["checkpointsCreated"] == 3 and record["latestCheckpoint"].endswith("-6")
    assert "failedSaves" not in record

    # A new job restores the same step on every rank, each its own file.
    k = job(3)
    loaders = [ToyLoader(r) for r in range(3)]
    steps = run_ranks(3, lambda r: k.ckpts[r].restore(loaders[r]).step)
    assert steps == [6, 6, 6] and [ld.loaded for ld in loaders] == [[6, r] for r in range(3)]


def test_a_failure_on_one_rank_fails_that_save_everywhere_and_training_goes_on(
    job, tmp_path: Path
) -> None:
    j = job(3)

    def rank(r: int) -> list[bool]:
        c = j.ckpts[r]
        disk_full = OSError(errno.ENOSPC, "No space left on device") if r == 2 else None
        first = c.save(2, lambda: ToySave(r, [2, r], fail=disk_full), blocking=True)
        second = c.save(4, lambda: ToySave(r, [4, r]), blocking=True)
        return [first.ok, second.ok]

    assert run_ranks(3, rank) == [[False, True]] * 3
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(4, True)]
    record = j.ckpts[0].progress.checkpointing
    assert record.failed_saves == 1 and record.last_failed_step == 2
    assert "rank 2" in record.last_error and "No space left" in record.last_error
    assert all(c.failed_saves == 1 for c in j.ckpts)


def test_a_signal_during_a_save_stops_after_it_at_the_agreed_step(job, tmp_path: Path) -> None:
    """SIGTERM on rank 1 while the periodic save at 2 is still being written: it is finished,
    every rank stops at the same later step, saves it once and answers preStop."""
    j = job(2)
    gate, entered = threading.Event(), threading.Event()

    def rank(r: int) -> int | None:
        c = j.stops[r]
        for step in range(1, 10):
            d = c.decide(step)
            if d.stop:
                c.save_at(step, lambda s=step: ToySave(r, [s, r]))
                return step
            if d.persistent:
                held = gate if step == 2 else None
                c.ckpt.save(
                    step, lambda s=step, h=held: ToySave(r, [s, r], gate=h, entered=entered)
                )
            if step == 2 and r == 1:
                assert entered.wait(10)
                c.triggers.signal.fired = True  # what the handler does on SIGTERM
            if step == 3:
                gate.set()
        return None

    stopped = run_ranks(2, rank)
    assert stopped[0] == stopped[1] == 4  # asked at 2's end, agreed at 3 (pipelined), saved at 4
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(2, True), (4, True)]
    assert j.ckpts[0].progress.checkpointing.extra["latestCheckpointReason"] == REASON_JIT
    root = tmp_path / "ckpt"
    reasons = {
        e.step: read_manifest(root / checkpoint_dir_name(e.step)).extra[MANIFEST_REASON]
        for e in layout.scan(root)
    }
    assert reasons == {2: REASON_PERIODIC, 4: REASON_JIT}
    for r in range(2):  # each pod's preStop is answered
        done = json.loads((tmp_path / f"run-{r}" / "checkpoint-done").read_text())
        assert done["step"] == 4 and done["checkpoint"].endswith("checkpoint-4")


def test_two_requests_at_once_make_one_save_and_one_answer(job, tmp_path: Path) -> None:
    j = job(2)
    for r in range(2):  # SIGTERM and the preStop request, on both ranks
        j.stops[r].triggers.signal.fired = True
        (tmp_path / f"run-{r}").mkdir()
        (tmp_path / f"run-{r}" / "checkpoint-request").write_text("")
    stopped = run_ranks(2, lambda r: _train(j.stops[r], r, range(1, 10)))
    assert stopped == [2, 2]  # asked before step 1; agreed after it; saved at 2
    assert [e.step for e in layout.scan(tmp_path / "ckpt")] == [2]
    assert j.ckpts[0].progress.checkpointing.checkpoints_created == 1
    for r in range(2):
        assert (tmp_path / f"run-{r}" / "checkpoint-done").exists()
        assert not (tmp_path / f"run-{r}" / "checkpoint-request").exists()


def test_a_prestop_request_during_restore_stops_at_the_restored_step_without_saving(
    job, tmp_path: Path
) -> None:
    first = job(2)
    run_ranks(2, lambda r: _train(first.stops[r], r, range(1, 5)))  # saves 2 and 4
    j = job(2)

    def arrives() -> None:  # the kubelet runs preStop while the checkpoint is being loaded
        (tmp_path / "run-0").mkdir(exist_ok=True)
        (tmp_path / "run-0" / "checkpoint-request").write_text("")

    loaders = [ToyLoader(r, on_apply=arrives if r == 0 else None) for r in range(2)]

    def rank(r: int) -> int | None:
        restored = j.ckpts[r].restore(loaders[r])
        assert restored is not None and restored.step == 4
        return _train(j.stops[r], r, range(5, 10))

    assert run_ranks(2, rank) == [6, 6]
    # Step 6 is saved by the stop (4 was restored, so 6 is not durable yet): the request arrived
    # before the first step, was agreed at the end of 5 and honoured at 6.
    assert [e.step for e in layout.scan(tmp_path / "ckpt")] == [4, 6]
    done = json.loads((tmp_path / "run-0" / "checkpoint-done").read_text())
    assert done["step"] == 6


def test_a_stop_at_a_step_already_durable_answers_without_saving_again(job, tmp_path) -> None:
    j = job(1)
    c, s = j.ckpts[0], j.stops[0]
    assert c.save(2, lambda: ToySave(0, [2, 0]), blocking=True).ok
    s.triggers.signal.fired = True
    assert s.save_at(2, lambda: pytest.fail("staged again")) is True
    done = json.loads((tmp_path / "run-0" / "checkpoint-done").read_text())
    assert done["checkpoint"].endswith("checkpoint-2")
    assert c.progress.checkpointing.checkpoints_created == 1


def test_a_rank_that_never_answers_fails_the_save_on_the_others_and_says_why(
    job, tmp_path: Path
) -> None:
    j = job(3, timeout=1.0)

    def rank(r: int):
        if r == 2:
            return None  # hung in a data loader: never reaches the save
        return j.stops[r].save_at(2, lambda: ToySave(r, [2, r]))

    assert run_ranks(3, rank) == [False, False, None]
    record = j.ckpts[0].progress.checkpointing
    assert record.failed_saves == 1 and "agreement" in record.last_error
    assert "did not answer" in record.last_error
    failed = json.loads((tmp_path / "run-0" / "checkpoint-failed").read_text())
    assert failed["step"] == 2 and "did not answer" in failed["error"]
    # Nothing half-written counts as a checkpoint.
    assert [e for e in layout.scan(tmp_path / "ckpt") if e.complete] == []


def test_a_missing_local_copy_on_one_rank_makes_every_rank_use_the_persistent_tier(
    job, tmp_path: Path
) -> None:
    env = {"CHECKPOINT_LOCAL_DIR": "", "CHECKPOINT_LOCAL_PERIOD": "1"}
    j = job(2, **env)
    for r, c in enumerate(j.ckpts):  # a ramdisk per node
        c.local = type(c.persistent)(str(tmp_path / f"ramdisk-{r}"), "local")
        c.schedule.local_enabled = True
    run_ranks(2, lambda r: _train(j.stops[r], r, range(1, 4)))
    assert [e.step for e in layout.scan(tmp_path / "ramdisk-0")] == [3]
    assert [e.step for e in layout.scan(tmp_path / "ckpt")] == [2]
    shutil.rmtree(tmp_path / "ramdisk-1" / "checkpoint-3")  # node 1 was replaced
    k = job(2, **env)
    for r, c in enumerate(k.ckpts):
        c.local = type(c.persistent)(str(tmp_path / f"ramdisk-{r}"), "local")
    restored = run_ranks(2, lambda r: k.ckpts[r].restore(ToyLoader(r)))
    assert [(x.step, x.tier.name) for x in restored] == [(2, "persistent")] * 2


def test_the_core_needs_no_torch() -> None:
    code = (
        "import sys, trainer_runtime.protocol, trainer_runtime.stop;"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')]"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _away(c: JitStop, away: threading.Event, *, update_after: bool = False) -> None:
    """The training thread leaves the boundary (an evaluation, a data wait) until `away` is set;
    then it takes its next optimizer step and reaches the next boundary."""
    if update_after:
        c.before_update()
        c.mark_update()
    assert away.wait(30)


def test_a_stop_during_an_evaluation_is_saved_by_the_watcher_at_the_last_step(
    job, tmp_path: Path
) -> None:
    j = job(2)
    j.watch()
    back = threading.Event()

    def rank(r: int) -> bool:
        c = j.stops[r]
        for step in range(1, 4):
            assert not c.decide(step).stop
            c.ckpt.write_progress(c.ckpt.progress.build(step))  # rank 0's is the file
        if r == 1:
            c.triggers.signal.fired = True  # SIGTERM while both ranks evaluate
        _away(c, back)
        c.before_update()  # the next optimizer step (after the watcher's save: not held)
        c.mark_update()
        return c.decide(4).stop

    def release_when_saved() -> None:
        done = [tmp_path / f"run-{r}" / "checkpoint-done" for r in range(2)]
        while not all(p.exists() for p in done):
            threading.Event().wait(0.02)
        back.set()

    threading.Thread(target=release_when_saved, daemon=True).start()
    assert run_ranks(2, rank) == [True, True]
    assert [(e.step, e.complete) for e in layout.scan(tmp_path / "ckpt")] == [(3, True)]
    assert all(s.watcher.took_over for s in j.stops)
    for r in range(2):
        assert json.loads((tmp_path / f"run-{r}" / "checkpoint-done").read_text())["step"] == 3
    record = j.ckpts[0].progress.checkpointing
    assert record.extra["latestCheckpointReason"] == REASON_JIT
    # The record went out at once: the training thread may not be back before the SIGKILL.
    assert json.loads((tmp_path / "progress.json").read_text())["checkpointing"][
        "latestCheckpoint"
    ].endswith("checkpoint-3")


def test_a_rank_one_step_ahead_sets_the_step_and_updates_are_held_past_it(
    job, tmp_path: Path
) -> None:
    """Rank 0 completed step 4's update and went away before its boundary; rank 1 is still at
    3 and about to update. The ranks agree on 4: rank 1 may take its step, none may take 5."""
    j = job(2)
    back, at_hold = threading.Event(), threading.Event()
    held: list[bool] = []

    def rank(r: int) -> bool:
        c = j.stops[r]
        for step in range(1, 4):
            c.decide(step)
        if r == 0:
            c.before_update()
            c.mark_update()  # step 4 done; the boundary not reached yet
            c.triggers.signal.fired = True
            _away(c, back)
        else:
            threading.Event().wait(1.0)  # behind: the watcher has agreed on 4 by now
            c.before_update()  # step 4's update is allowed
            c.mark_update()
            at_hold.set()
            c.before_update()  # step 5's: held until the save is durable
            held.append(layout.is_complete(tmp_path / "ckpt" / "checkpoint-4"))
            _away(c, back)
        return c.decide(4).stop

    j.watch(takeover=0.2)

    def release_when_saved() -> None:
        while not (tmp_path / "run-0" / "checkpoint-done").exists():
            threading.Event().wait(0.02)
        back.set()

    threading.Thread(target=release_when_saved, daemon=True).start()
    assert run_ranks(2, rank) == [True, True]
    assert [e.step for e in layout.scan(tmp_path / "ckpt")] == [4]
    assert held == [True]


def test_a_rank_that_never_reaches_the_step_fails_the_stop_and_says_why(
    job, tmp_path: Path
) -> None:
    j = job(2)
    back = threading.Event()

    def rank(r: int) -> None:
        c = j.stops[r]
        for step in range(1, 4):
            c.decide(step)
        if r == 0:
            c.before_update()
            c.mark_update()  # rank 0 completed 4; rank 1 is stuck before its update
            c.triggers.signal.fired = True
        assert back.wait(30)

    j.watch(takeover=0.2)
    for s in j.stops:
        s.watcher.reach_timeout = 0.5

    def release_when_answered() -> None:
        while not (tmp_path / "run-0" / "checkpoint-failed").exists():
            threading.Event().wait(0.02)
        back.set()

    threading.Thread(target=release_when_answered, daemon=True).start()
    run_ranks(2, rank)
    assert [e for e in layout.scan(tmp_path / "ckpt") if e.complete] == []
    failed = json.loads((tmp_path / "run-0" / "checkpoint-failed").read_text())
    assert failed["step"] == 4 and "step 4" in failed["error"]
    record = j.ckpts[0].progress.checkpointing
    assert record.failed_saves == 1 and record.last_error.startswith("stop: ")


def test_a_stop_at_the_boundary_is_the_training_threads_and_the_watcher_stays_out(
    job, tmp_path: Path
) -> None:
    j = job(2)
    j.watch(takeover=30)  # never overdue here
    j.stops[1].triggers.signal.fired = True
    stopped = run_ranks(2, lambda r: _train(j.stops[r], r, range(1, 10)))
    assert stopped == [1, 1] or stopped == [2, 2]  # agreed at a boundary, as without a watcher
    assert not any(s.watcher.took_over for s in j.stops)
    assert [e.step for e in layout.scan(tmp_path / "ckpt")] == [stopped[0]]
