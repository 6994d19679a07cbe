"""Runs a training script (argv[1], with the rest of argv) with every checkpoint commit slowed by
$SLOW_COMMIT_SECONDS, standing in for a model large enough that the last writes of a save take
that long. With $NO_HANDOVER_WAIT=1 the restore does not wait for a save in flight (what
kubeckpt did before trainer_runtime/handover.py), to show the failure it prevents."""

from __future__ import annotations

import os
import runpy
import sys
import time

from trainer_runtime import handover, layout

delay = float(os.environ.get("SLOW_COMMIT_SECONDS", "0"))
finalize = layout.finalize


def slow_finalize(path, manifest):  # type: ignore[no-untyped-def]
    print(f"slow_commit: committing {path} in {delay:.0f} s", flush=True)
    time.sleep(delay)
    finalize(path, manifest)


layout.finalize = slow_finalize
if os.environ.get("NO_HANDOVER_WAIT") == "1":
    handover.wait_for_saves_in_flight = lambda *a, **k: []

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
