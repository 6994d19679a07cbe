"""A rank whose training raises inside `with mgr:` leaves at once with its own error. The close
that `with` runs then leaves the agreement groups alone: ending them waits for every rank (a
barrier, up to KUBECKPT_AGREEMENT_TIMEOUT), and the other rank is still training. The real torch
adapter under torchrun, two ranks."""

from __future__ import annotations

from pathlib import Path

from harness import ckpt_env, finish, start, tail, torchrun_argv


def test_a_rank_that_raises_exits_with_its_error_without_waiting_for_the_others(
    tmp_path: Path,
) -> None:
    env = ckpt_env(tmp_path, KUBECKPT_AGREEMENT_TIMEOUT="600")
    argv = torchrun_argv(tmp_path / "status", steps=40, extra=("--crash-at=5",))
    proc = start(argv, env, tmp_path / "run.log")
    # Far below the agreement timeout: the failed rank did not wait in the groups' barrier.
    rc = finish(proc, timeout=120)
    log = tail(tmp_path / "run.log", 20000)
    assert rc != 0 and "injected: rank 1 fails at step 5" in log, log
    # torchrun names the failed rank's own exit code: the exception's 1, not an abort at exit.
    assert "rank      : 1" in log and "exitcode  : 1 " in log, log
    assert "terminate called" not in log, log
