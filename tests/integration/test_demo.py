"""`make demo` end to end: hack/demo.py --fast as a subprocess, with a control plane of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_demo_preempts_and_resumes_at_the_jit_step() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "hack" / "demo.py"), "--fast"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "PASS: kubeckpt demo" in out, out[-3000:]
    assert "FAIL" not in out, out[-6000:]
    # progress in plain kubectl: the printer columns, several times
    assert out.count("$ kubectl get tp -n demo") >= 3
    assert re.search(r"NAME\s+JOB\s+STEP\s+PERCENT\s+LOSS\s+ETA\s+LAST-CHECKPOINT", out)
    # the just-in-time checkpoint and the resume at exactly its step
    jit = re.search(r"train: stopped at step (\d+) after a just-in-time checkpoint", out)
    assert jit, out[-6000:]
    step = jit.group(1)
    assert f"train: resumed from checkpoint-{step} at step {step}" in out
    assert "train: finished at step 200" in out
    for reason in ("CheckpointSaved", "Resumed", "Completed"):
        assert reason in out, reason
    # JITCheckpoint unless an exec poll read the JIT checkpoint first (the demo then says so).
    assert "JITCheckpoint" in out or "named it CheckpointSaved, not JITCheckpoint" in out
