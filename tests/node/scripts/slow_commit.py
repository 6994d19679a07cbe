"""Runs a training script (argv[1], with the rest of argv) with the commit of a just-in-time
checkpoint (one asked for by the preStop hook) slowed by $SLOW_COMMIT_SECONDS, standing in for a
model large enough that the last writes of a save take that long.
With $NO_HANDOVER_WAIT=1 the restore does not wait for a save in flight (what
kubeckpt did before trainer_runtime/handover.py), to show the failure it prevents."""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

from trainer_runtime import handover, layout

delay = float(os.environ.get("SLOW_COMMIT_SECONDS", "0"))
finalize = layout.finalize


REQUEST = Path(os.environ.get("CHECKPOINT_CONTROL_DIR", "/var/run/kubeckpt"), "checkpoint-request")


def slow_finalize(path, manifest):  # type: ignore[no-untyped-def]
    if REQUEST.exists():  # answered (and removed) only once this save is durable
        print(f"slow_commit: committing {path} in {delay:.0f} s", flush=True)
        time.sleep(delay)
    finalize(path, manifest)


layout.finalize = slow_finalize
if os.environ.get("NO_HANDOVER_WAIT") == "1":
    handover.wait_for_saves_in_flight = lambda *a, **k: []

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
