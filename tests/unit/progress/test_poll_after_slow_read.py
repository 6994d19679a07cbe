"""The next poll counts from the end of a read, not its start. A read that took seconds (a slow
or hung `cat`, up to the exec timeout) was due again at once when its own status write brought
the job back, so a namespace's slow jobs took its share of the exec slots again and again while
its other jobs, refused as Busy and back only after `retry_after`, were never read (the cluster
fairness test failed so: neither endless job ever read)."""

from __future__ import annotations

from typing import Any

from test_victim_reads import (
    KEY,
    RUNNING,
    Pods,
    controller,
    put_pods,
    reconcile,
    record,
    replacement,
)

from reconciler.clock import FakeClock
from reconciler.exec import ExecResult, ExecTimeout

SLOW = 20.0  # the read's duration: over the `early` interval (15 s), as a hung read can be


class SlowPods(Pods):
    """Each exec takes SLOW seconds on the controller's fake clock (and, with `hang`, then
    times out as a hung `cat` does)."""

    def __init__(self, files: dict[str, str], clock: FakeClock, hang: bool = False) -> None:
        super().__init__(files)
        self.clock, self.hang = clock, hang

    async def exec(self, client: Any, ns: str, pod: str, argv: list, **kw: Any) -> ExecResult:
        self.log.append(("exec", pod))
        self.clock.step(SLOW)
        if self.hang:
            raise ExecTimeout(f"exec in {ns}/{pod} timed out after {SLOW}s", ExecResult())
        return ExecResult(stdout=self.files[pod].encode(), exit_code=0)


def _execs(fx: Pods) -> int:
    return sum(1 for e in fx.log if e[0] == "exec")


def test_a_slow_read_is_not_due_again_when_its_own_write_brings_the_job_back() -> None:
    for hang in (False, True):
        fx = SlowPods({"r": record(41, 40)}, FakeClock(), hang=hang)
        ctrl = controller(fx, {})
        fx.clock = ctrl.clock  # type: ignore[assignment]
        put_pods(ctrl, replacement(RUNNING))
        result = reconcile(ctrl)
        assert _execs(fx) == 1
        assert any(e[0] == "write" for e in fx.log), "the outcome is written (its event comes)"
        early = ctrl.settings.early
        assert result is not None and result.requeue_after == early
        # The status write's event: a reconcile right after the read reads nothing.
        again = reconcile(ctrl)
        assert _execs(fx) == 1, f"read again at once after a {SLOW} s read (hang={hang})"
        assert again is not None and again.requeue_after is not None
        assert 0 < again.requeue_after <= early
        # One interval after the end of the read, it is due.
        ctrl.clock.step(early)  # type: ignore[attr-defined]
        reconcile(ctrl)
        assert _execs(fx) == 2


def test_next_poll_is_an_interval_after_the_reads_end() -> None:
    fx = SlowPods({"r": record(41, 40)}, FakeClock())
    ctrl = controller(fx, {})
    fx.clock = ctrl.clock  # type: ignore[assignment]
    put_pods(ctrl, replacement(RUNNING))
    start = ctrl.clock.now()
    reconcile(ctrl)
    assert ctrl._state[KEY].next_poll == start + SLOW + ctrl.settings.early
