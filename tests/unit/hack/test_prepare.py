"""hack/prepare.py: the first-run jobs side by side. Real child processes (bash scripts that speak
the build scripts' "plan" and "step" lines), no cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import prepare
import pytest
from prepare import Job, Prepare

HACK = Path(prepare.__file__).resolve().parent


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(prepare, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(prepare, "TIMES", tmp_path / "cache" / "prepare-times.json")
    monkeypatch.setattr(prepare, "MIN_MEASURED", 0.5)
    monkeypatch.setattr(prepare, "HEARTBEAT", 0.5)
    return tmp_path


def script(body: str) -> list[str]:
    return ["bash", "-c", body]


def test_steps_are_announced_measured_and_learned(capsys: pytest.CaptureFixture[str]) -> None:
    build = script(
        'echo "[b] plan: one=fast,slow two=other"; echo "[b] step cached: start"; '
        'echo "[b] step cached: done in 0 s"; echo "[b] step fast: start"; '
        'echo "[b] step fast: done"; echo "[b] step slow: start"; sleep 1.6; '
        'echo "[b] step slow: done"; echo "[b] step other: start"; echo "[b] step other: done"'
    )
    assert Prepare([Job("binaries", build)]).run() == 0
    out = capsys.readouterr().out
    assert "binaries: slow (usually" in out and "binaries: slow done in 0:01" in out
    assert "binaries: cached" not in out  # outside the plan: nothing to say
    assert "binaries: fast done" not in out  # too quick to be a build
    assert "about" in out and "min left" in out  # the heartbeat ran during the sleep
    learned = json.loads(prepare.TIMES.read_text())
    assert set(learned) == {"slow"} and 1 <= learned["slow"] <= 3
    # The next run estimates from what this machine measured.
    assert Prepare([]).est["slow"] == learned["slow"]


def test_a_failed_job_stops_the_others_and_shows_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "still-running"
    slow = script(f"sleep 30; touch {marker}")
    bad = script('echo "[x] plan: a=broken"; echo "[x] step broken: start"; echo boom-42; exit 3')
    t0 = time.monotonic()
    assert Prepare([Job("slow", slow), Job("bad", bad)]).run() == 1
    assert time.monotonic() - t0 < 10  # the sleeping job was stopped, not waited for
    captured = capsys.readouterr()
    assert "boom-42" in captured.err  # the failed job's log tail
    assert "bad failed (exit 3)" in captured.out
    time.sleep(0.2)
    assert not marker.exists()


def test_the_estimate_counts_the_longest_lane() -> None:
    est = {"a": 100.0, "b": 50.0, "c": 400.0}
    lane = prepare.Lane("k8s", ["b"], current="a", since=0.0)
    assert lane.remaining(30.0, est) == 70 + 50
    assert prepare.Lane("go", ["c"]).remaining(30.0, est) == 400
    assert lane.remaining(500.0, est) == 50  # an overrun step counts as about to end


def test_a_terminated_prepare_stops_its_jobs(tmp_path: Path) -> None:
    """SIGTERM (a CI timeout, `kill`) stops the jobs too: they run in sessions of their own, so
    nothing else would, and a Go build left running holds the build lock for the next run."""
    marker = tmp_path / "job-pid"
    env = {**os.environ, "KUBECKPT_CACHE": str(tmp_path / "cache")}
    script = (
        "import prepare, sys\n"
        "job = prepare.Job('sleeper', ['bash', '-c', 'echo $$ > " + str(marker) + "; sleep 60'])\n"
        "sys.argv = ['prepare']\n"
        "prepare.jobs_for = lambda purpose: [job]\n"
        "sys.exit(prepare.main())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env={**env, "PYTHONPATH": str(HACK)}, cwd=HACK.parent
    )
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    job_pid = int(marker.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 130
    time.sleep(0.3)
    with pytest.raises(ProcessLookupError):
        os.kill(job_pid, 0)
