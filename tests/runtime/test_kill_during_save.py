"""Group 2: SIGKILL at random moments during saves (24 trials). After each, every checkpoint that
reads as complete verifies byte for byte, resume picks the newest of them, and the run still ends
bitwise equal to one never interrupted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import process_env

TRIALS = 24


def test_sigkill_during_saves(tmp_path: Path) -> None:
    driver = Path(__file__).with_name("kill_trials.py")
    env = process_env({})
    env["PYTHONPATH"] = f"{driver.parent}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        [sys.executable, str(driver), str(tmp_path), str(TRIALS), "1337"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    results = report["results"]
    assert len(results) == TRIALS, report["io_calls_per_run"]
    assert len({r["kill_at"] for r in results}) == TRIALS  # a different moment each time
    for r in results:
        where = f"trial {r['trial']} (killed before writer I/O call {r['kill_at']})"
        assert r["killed"], f"{where}: the run was not killed"
        bad = [c for c in r["left"] if c["complete"] and c["problems"]]
        assert not bad, f"{where}: a checkpoint reads complete but is not: {bad}"
        complete = [c["step"] for c in r["left"] if c["complete"]]
        expected = f"checkpoint-{max(complete)}" if complete else None
        assert r["resume_rc"] == 0, where
        assert r["resumed_from"] == expected, (where, r["resumed_from"], r["left"])
        assert r["same"], f"{where}: resumed run differs from the uninterrupted one"
    # The moments must hit both "some checkpoint existed" and "the first save was cut".
    assert any(r["resumed_from"] for r in results)
    assert any(not c["complete"] for r in results for c in r["left"])
