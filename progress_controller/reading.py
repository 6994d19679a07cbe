"""Reading a job's progress: the file through pods/exec, or the termination message.

The command is always an argv (`cat <path>`, the path from the pod's own env): no shell ever sees
it. An image without `cat` (exit 127, or the runtime's "executable file not found") is read with
`python3 -c` instead. At most MAX_PROGRESS_BYTES + 1 bytes are read: the exec stream is closed as
soon as that many arrived (`stop_at_cap`), so a huge or endless file (`/dev/zero`) is recognised as
too large without being held in memory or read for the whole timeout. Every failure becomes a
`ReadError` with a condition reason; the contract (`parse_progress`) validates what was read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.errors import ApiError, NotFound
from reconciler.exec import ExecError, ExecResult, ExecTimeout, executable_not_found
from trainer_runtime.contract.errors import ContractError
from trainer_runtime.contract.progress import MAX_PROGRESS_BYTES, ProgressRecord, parse_progress

READ_CAP = MAX_PROGRESS_BYTES + 1

# Reads the file named by argv[1], at most int(argv[2]) bytes; exit 1 if it does not exist.
PYTHON_READER = (
    "import sys\n"
    "try:\n"
    "    f = open(sys.argv[1], 'rb')\n"
    "except FileNotFoundError:\n"
    "    sys.stderr.write('No such file or directory\\n'); sys.exit(1)\n"
    "with f:\n"
    "    sys.stdout.buffer.write(f.read(int(sys.argv[2])))\n"
)

ExecFn = Callable[..., Awaitable[ExecResult]]


class ReadError(Exception):
    """A read that produced no record; `reason` is the condition reason (CamelCase)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _short(data: bytes, limit: int = 200) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def _run(
    exec_fn: ExecFn,
    client: Any,
    namespace: str,
    pod: str,
    argv: Sequence[str],
    container: str | None,
    timeout: float,  # noqa: ASYNC109 - passed on to exec
) -> tuple[ExecResult | None, BaseException | None]:
    try:
        r = await exec_fn(
            client,
            namespace,
            pod,
            list(argv),
            container=container,
            max_bytes=READ_CAP,
            stop_at_cap=True,
            timeout=timeout,
        )
    except ExecTimeout as e:
        raise ReadError("ExecTimeout", f"reading the progress file timed out: {e}") from None
    except NotFound:
        raise ReadError("PodNotFound", f"pod {pod} is gone") from None
    except ExecError as e:
        return None, e
    except ApiError as e:
        raise ReadError("ExecFailed", f"exec in pod {pod} failed: {e}") from None
    return r, None


async def read_file(
    exec_fn: ExecFn,
    client: Any,
    namespace: str,
    pod: str,
    container: str | None,
    path: str,
    *,
    timeout: float = 10.0,  # noqa: ASYNC109 - passed on to exec
) -> tuple[bytes, bool]:
    """The file's bytes (at most READ_CAP) and whether the `python3` fallback was used."""
    result, err = await _run(exec_fn, client, namespace, pod, ["cat", path], container, timeout)
    fallback = False
    if executable_not_found(err, result):
        fallback = True
        argv = ["python3", "-c", PYTHON_READER, path, str(READ_CAP)]
        result, err = await _run(exec_fn, client, namespace, pod, argv, container, timeout)
        if executable_not_found(err, result):
            raise ReadError(
                "NoReader", "the container has neither `cat` nor `python3` to read the file with"
            )
    if result is None:
        raise ReadError("ExecFailed", f"exec in pod {pod} failed: {err}")
    if result.stdout_truncated or len(result.stdout) > MAX_PROGRESS_BYTES:
        # Before the exit code: a read stopped at the cap has none.
        raise ReadError(
            "ProgressFileTooLarge", f"{path} is over the limit of {MAX_PROGRESS_BYTES} bytes"
        )
    if result.exit_code is None:  # stopped because stderr passed the cap
        raise ReadError(
            "ProgressFileUnreadable", f"reading {path} wrote over {READ_CAP} bytes of errors"
        )
    if result.exit_code != 0:
        stderr = _short(result.stderr)
        if "no such file" in stderr.lower():
            raise ReadError("ProgressFileMissing", f"{path} does not exist (yet)")
        raise ReadError(
            "ProgressFileUnreadable",
            f"reading {path} exited with {result.exit_code}: {stderr or 'no output'}",
        )
    return result.stdout, fallback


def parse(data: bytes | str, what: str = "progress file") -> ProgressRecord:
    """Validate with the contract; ReadError(ProgressFileEmpty/ProgressFileInvalid) if bad."""
    if not (data.strip() if isinstance(data, str) else bytes(data).strip()):
        raise ReadError(
            "ProgressFileEmpty" if what == "progress file" else "TerminationMessageEmpty",
            f"the {what} is empty",
        )
    try:
        return parse_progress(data)
    except ContractError as e:
        reason = "ProgressFileInvalid" if what == "progress file" else "TerminationMessageInvalid"
        raise ReadError(reason, f"the {what} is invalid: {e}") from None


@dataclass(frozen=True)
class Reading:
    record: ProgressRecord
    source: str  # "exec" or "terminationMessage"
    fallback: bool = False
