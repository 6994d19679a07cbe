"""Which process incarnation a preStop request belongs to, without comparing clocks.

The control directory is an emptyDir: it outlives a container restart, so a request an earlier
container's preStop hook wrote may still be there when the next container starts, and must not
stop it at once. The hook writes its own identity into the request: the kernel's boot id and its
start time in clock ticks since boot (/proc/self/stat, field 22). The runtime takes a request for
itself when it comes from the same boot and from a process that started no earlier than itself:
an earlier container's hook ran, and ended, before this container's processes started.

Both numbers come from the kernel the hook and the runtime share (the hook runs in the training
container), and neither is a wall clock: `/proc/uptime`, which LXCFS rewrites to show the
container's uptime while /proc/self/stat keeps counting from the host's boot, is not read. A
request without an identity (the webhook's shell fallback for images without kubeckpt-prestop, or
a person's `touch`) is judged by its modification time against this process's start, which is
computed from CLOCK_BOOTTIME, the clock the start ticks count in, not from /proc/uptime.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

BOOT_ID_FILE: Final = "/proc/sys/kernel/random/boot_id"
# Keys of the request file (docs/trainer_runtime.md, "The preStop hook").
BOOT_ID_KEY: Final = "bootId"
START_TICKS_KEY: Final = "startTicks"


@dataclass(frozen=True)
class Incarnation:
    """A process as the kernel knows it: its boot, and its start in ticks since that boot."""

    boot_id: str
    start_ticks: int

    def to_request(self) -> dict[str, Any]:
        return {BOOT_ID_KEY: self.boot_id, START_TICKS_KEY: self.start_ticks}

    @classmethod
    def from_request(cls, body: object) -> Incarnation | None:
        """The identity a request carries, or None (none, or malformed: judged otherwise)."""
        if not isinstance(body, Mapping):
            return None
        boot_id, ticks = body.get(BOOT_ID_KEY), body.get(START_TICKS_KEY)
        if not isinstance(boot_id, str) or not 0 < len(boot_id) <= 64:
            return None
        if isinstance(ticks, bool) or not isinstance(ticks, int) or ticks < 0:
            return None
        return cls(boot_id, ticks)

    def may_ask(self, requester: Incarnation) -> bool:
        """Whether a request from `requester` is for this process: the same boot, and started
        no earlier (an earlier container's hook started before this process did)."""
        return requester.boot_id == self.boot_id and requester.start_ticks >= self.start_ticks


def start_ticks(pid: int | str = "self") -> int | None:
    """A process's start in clock ticks since boot (/proc/<pid>/stat, field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # field 22 of the file; two are before the ')'
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as f:
            value = f.read(128).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


def current() -> Incarnation | None:
    """This process's incarnation, or None where the kernel does not say (not Linux)."""
    ticks, boot = start_ticks(), boot_id()
    return Incarnation(boot, ticks) if ticks is not None and boot is not None else None


def process_start_time() -> float:
    """Wall-clock start of this process, for requests without an identity: now minus the time
    since it started by CLOCK_BOOTTIME (what /proc/self/stat's ticks count in; not /proc/uptime,
    which LXCFS rewrites), or now where unknown."""
    ticks = start_ticks()
    try:
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        hz = os.sysconf("SC_CLK_TCK")
    except (AttributeError, OSError, ValueError):
        return time.time()
    if ticks is None or hz <= 0:
        return time.time()
    return time.time() - max(0.0, since_boot - ticks / hz)
