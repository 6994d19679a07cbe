"""Child processes of a local cluster: started so that they die with us, stopped by process
group, waited for until ready. Shared by the control plane (cluster.py), the real node (node.py)
and the Kubeflow Trainer stack, so that none of them imports another for these."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A component did not start; the message carries the end of its log."""


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGKILL when our process dies, however it dies, and its own
    process group (so `stop_process` reaches its children too)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgid(0, 0)


def stop_process(popen: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM the process group of a child started with `die_with_parent`; SIGKILL after
    `timeout`."""
    if popen is None or popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGTERM)
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(5)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Process:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            preexec_fn=die_with_parent,
            close_fds=True,
        )
        out.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.popen, timeout)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


def wait_ready(
    what: str, proc: Process | None, check: Callable[[], object], timeout: float
) -> None:
    """Poll `check` until it is truthy; fail at once, with the log's end, if `proc` exits."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise ClusterError(f"{proc.name} exited while waiting for {what}:\n{proc.tail()}")
        try:
            if check():
                return
        except Exception as e:
            last = e
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    tail = f"\n{proc.name} log:\n{proc.tail()}" if proc else ""
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last}){tail}")
