"""Run a command in a container over the pods/exec websocket.

- Offers `v5.channel.k8s.io`, then `v4.channel.k8s.io` (what the API server picks is in
  `ExecResult.protocol`). Each binary frame starts with a channel byte: 0 stdin, 1 stdout,
  2 stderr, 3 error (a Status JSON when the command ends), 255 close (v5: we close stdin with it).
- The command is an argv list, sent as repeated `command=` parameters: never a shell string.
- stdout and stderr are kept apart, each up to `max_bytes`, so a chatty command cannot exhaust
  memory. By default the rest is read and dropped up to the exit status (the result says it was
  truncated); with `stop_at_cap` the stream is closed as soon as either cap is passed, so a
  command whose output never ends (`cat /dev/zero`) costs the cap, not the whole timeout; the
  result then has no exit code.
- The exit code comes from the error channel: Success is 0; a kubelet sends reason
  NonZeroExitCode with an ExitCode cause. KWOK (the fake kubelet of our local control plane)
  sends an InternalError whose message ends in Go's "exit status N" or "signal: NAME"; we parse
  that as a fallback (a signal gives 128 + its number, as a shell reports it).
- `timeout` bounds the whole exchange; on expiry `ExecTimeout` carries what arrived so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from .errors import KubeError
from .resources import PODS

if TYPE_CHECKING:
    from .client import Client

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255

_EXIT_STATUS = re.compile(r"exit status (\d+)\s*$")
_SIGNALLED = re.compile(r"signal: ([a-z0-9 ]+)\s*$")
# Go's names for signals (syscall signal table) -> numbers on Linux.
_GO_SIGNALS = {
    "hangup": signal.SIGHUP,
    "interrupt": signal.SIGINT,
    "quit": signal.SIGQUIT,
    "illegal instruction": signal.SIGILL,
    "aborted": signal.SIGABRT,
    "bus error": signal.SIGBUS,
    "floating point exception": signal.SIGFPE,
    "killed": signal.SIGKILL,
    "user defined signal 1": signal.SIGUSR1,
    "segmentation fault": signal.SIGSEGV,
    "user defined signal 2": signal.SIGUSR2,
    "broken pipe": signal.SIGPIPE,
    "alarm clock": signal.SIGALRM,
    "terminated": signal.SIGTERM,
}


class ExecError(KubeError):
    """The command could not be run (no such executable, container not running, ...)."""

    def __init__(self, message: str, status: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status or {}


class ExecTimeout(ExecError, TimeoutError):
    def __init__(self, message: str, partial: ExecResult) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass
class ExecResult:
    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    protocol: str = ""
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def exit_code_from_status(status: dict[str, Any]) -> int | None:
    """The command's exit code from an error-channel Status, or None if it did not run."""
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message", ""))
                except ValueError:
                    break
    message = str(status.get("message", ""))
    if m := _EXIT_STATUS.search(message):
        return int(m.group(1))
    if (m := _SIGNALLED.search(message)) and m.group(1) in _GO_SIGNALS:
        return 128 + int(_GO_SIGNALS[m.group(1)])
    return None


def executable_not_found(err: BaseException | None, result: ExecResult | None) -> bool:
    """Whether an exec failed because the command's executable is not in the container.

    Callers that try one program and then another (`cat`, then `python3`) need this, and there
    is no single signal for it: the runtime (runc or crun under containerd, or KWOK's Go exec)
    fails the exec itself, so there is no result, only an `ExecError` whose message says
    "executable file not found in $PATH" or "exec: ...: no such file or directory" / "starting
    container process ...: no such file or directory"; when the command is started through a
    shell or wrapper, it runs and exits 127 (the shell's "command not found"). So: with a result,
    exit code 127; without one, the error's message. Exit 126 (found, not executable) is not this.
    """
    if result is not None:
        return result.exit_code == 127
    text = str(err or "").lower()
    return "executable file not found" in text or (
        "no such file or directory" in text
        and ("exec:" in text or "starting container process" in text)
    )


class _Sink:
    """Keeps the first `cap` bytes; `truncated` once more arrived (the first byte past the cap)."""

    def __init__(self, cap: int) -> None:
        self.buf = bytearray()
        self.cap = cap
        self.truncated = False

    def write(self, data: bytes | memoryview) -> None:
        room = self.cap - len(self.buf)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        self.buf += data


async def exec_command(
    client: Client,
    namespace: str,
    pod: str,
    argv: Sequence[str],
    *,
    container: str | None = None,
    stdin: bytes | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109 - bounds the whole exchange, documented
    max_bytes: int = 1 << 20,
    stop_at_cap: bool = False,
    protocols: Sequence[str] = PROTOCOLS,
) -> ExecResult:
    """Run `argv` in the pod and return its output and exit code (raises ExecError if it could
    not run, ExecTimeout after `timeout`, ApiError for the request itself, e.g. NotFound).

    With `stop_at_cap`, the first byte past `max_bytes` on stdout or stderr ends the exchange:
    the connection is closed at once and the result (truncated, `exit_code` None) returned.

    With `stdin`, the bytes are sent and, on v5, stdin is then closed; v4 has no way to close
    stdin, so a command that reads to EOF would wait for the timeout there."""
    if isinstance(argv, str | bytes):
        raise TypeError("argv must be a list of arguments, not a shell string")
    if not argv:
        raise ValueError("argv is empty")
    params = [("command", str(a)) for a in argv]
    params += [("stdout", "true"), ("stderr", "true")]
    if stdin is not None:
        params.append(("stdin", "true"))
    if container:
        params.append(("container", container))
    result = ExecResult()
    out, err = _Sink(max_bytes), _Sink(max_bytes)

    def snapshot() -> ExecResult:
        result.stdout, result.stderr = bytes(out.buf), bytes(err.buf)
        result.stdout_truncated, result.stderr_truncated = out.truncated, err.truncated
        return result

    path = PODS.path(namespace, pod, "exec")
    ws: aiohttp.ClientWebSocketResponse | None = None
    try:
        async with asyncio.timeout(timeout):
            ws = await client.ws_connect(path, params=params, protocols=tuple(protocols))
            result.protocol = ws.protocol or ""
            if stdin is not None:
                await _send_stdin(ws, stdin, close=result.protocol.startswith("v5."))
            status = await _read(ws, out, err, stop_at_cap=stop_at_cap)
    except TimeoutError:
        raise ExecTimeout(
            f"exec in {namespace}/{pod} timed out after {timeout}s", snapshot()
        ) from None
    finally:
        if ws is not None:
            # The server has closed already unless we time out or stopped at the cap; then do
            # not wait on its reply (on expiry aiohttp drops the connection). At the cap the
            # command may still be writing: its close is not waited for at all beyond a moment.
            stopped = stop_at_cap and (out.truncated or err.truncated)
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                async with asyncio.timeout(0.1 if stopped else 1.0):
                    await ws.close()
    snapshot()
    if stop_at_cap and (out.truncated or err.truncated):
        return result  # ended by us: no exit status, the output says why
    if status is None:
        raise ExecError(f"exec in {namespace}/{pod}: the connection closed without a status")
    result.status = status
    result.exit_code = exit_code_from_status(status)
    if result.exit_code is None:
        raise ExecError(f"exec in {namespace}/{pod}: {status.get('message', status)}", status)
    return result


async def _send_stdin(ws: aiohttp.ClientWebSocketResponse, data: bytes, *, close: bool) -> None:
    chunk = 32 * 1024
    for i in range(0, len(data), chunk):
        await ws.send_bytes(bytes([STDIN]) + data[i : i + chunk])
    if close:
        await ws.send_bytes(bytes([CLOSE, STDIN]))


async def _read(
    ws: aiohttp.ClientWebSocketResponse, out: _Sink, err: _Sink, *, stop_at_cap: bool = False
) -> dict[str, Any] | None:
    status: dict[str, Any] | None = None
    error_bytes = bytearray()
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
            continue
        data = memoryview(msg.data)
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            out.write(payload)
        elif channel == STDERR:
            err.write(payload)
        elif channel == ERROR and len(error_bytes) < 65536:
            error_bytes += payload
        if stop_at_cap and (out.truncated or err.truncated):
            return None
    if error_bytes:
        try:
            status = json.loads(bytes(error_bytes))
        except ValueError:
            raise ExecError(f"unreadable exit status: {bytes(error_bytes[:200])!r}") from None
        if not isinstance(status, dict):
            raise ExecError(f"unreadable exit status: {bytes(error_bytes[:200])!r}")
    return status
