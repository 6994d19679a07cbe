"""`kubeckpt-prestop`: the container's preStop hook.

Writes $CHECKPOINT_CONTROL_DIR/checkpoint-request (with this process's boot id and start ticks,
incarnation.py), then waits for the runtime's answer
(`checkpoint-done` or `checkpoint-failed`) for at most the timeout, so the kubelet's SIGTERM follows
only once the just-in-time checkpoint is durable. Exit status: 0 saved, 1 the runtime reported a
failure, 2 no answer within the timeout, 3 the request could not be written.

The timeout is --timeout, else $KUBECKPT_PRESTOP_TIMEOUT, else $TORCH_ELASTIC_SHUTDOWN_TIMEOUT (the
webhook sets it to the grace period minus a margin), else 270 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..config import KUBECKPT_PRESTOP_TIMEOUT
from ..contract import (
    CHECKPOINT_CONTROL_DIR,
    DEFAULT_CONTROL_DIR,
    DONE_FILE,
    FAILED_FILE,
    REQUEST_FILE,
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
)
from ..fsutil import write_atomic
from . import incarnation

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_TIMEOUT = 2
EXIT_ERROR = 3
DEFAULT_TIMEOUT = 270.0


def default_timeout(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    for name in (KUBECKPT_PRESTOP_TIMEOUT, TORCH_ELASTIC_SHUTDOWN_TIMEOUT):
        raw = environ.get(name, "").strip()
        if raw:
            try:
                value = float(raw)
            except ValueError:
                continue
            if value >= 0:
                return value
    return DEFAULT_TIMEOUT


def request_checkpoint(control_dir: Path, timeout: float, poll: float = 0.05) -> int:
    done, failed = control_dir / DONE_FILE, control_dir / FAILED_FILE
    try:
        control_dir.mkdir(parents=True, exist_ok=True)
        # An answer left by an earlier container of this pod must not be taken for ours.
        for stale in (done, failed):
            stale.unlink(missing_ok=True)
        # Who asks (incarnation.py): the runtime tells this request from an earlier container's.
        me = incarnation.current()
        ident = me.to_request() if me is not None else {}
        body = json.dumps({"time": time.time(), "pid": os.getpid(), **ident}).encode() + b"\n"
        write_atomic(control_dir / REQUEST_FILE, body)
    except OSError as e:
        print(f"kubeckpt-prestop: cannot write the checkpoint request: {e}", file=sys.stderr)
        return EXIT_ERROR
    deadline = time.monotonic() + timeout
    while True:
        if done.exists():
            print(f"kubeckpt-prestop: checkpoint saved: {_read(done)}")
            return EXIT_DONE
        if failed.exists():
            print(f"kubeckpt-prestop: checkpoint failed: {_read(failed)}", file=sys.stderr)
            return EXIT_FAILED
        if time.monotonic() >= deadline:
            print(
                f"kubeckpt-prestop: no answer from the training process within {timeout:g} s",
                file=sys.stderr,
            )
            return EXIT_TIMEOUT
        time.sleep(poll)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()[:1000]
    except OSError:
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubeckpt-prestop", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--control-dir",
        default=os.environ.get(CHECKPOINT_CONTROL_DIR) or DEFAULT_CONTROL_DIR,
        help="where the request and answer files live (default $CHECKPOINT_CONTROL_DIR)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait at most")
    args = parser.parse_args(argv)
    timeout = default_timeout() if args.timeout is None else max(0.0, args.timeout)
    return request_checkpoint(Path(args.control_dir), timeout)


if __name__ == "__main__":
    sys.exit(main())
