"""Exec into KWOK pods through the real API server (websocket v5, and v4 when only it is offered):
exact bytes, exit codes, separate stderr, the byte cap (and the stream closed at it) and the
timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import run_pod, wait_exec_ready

from localcluster import LocalCluster
from progress_controller.reading import READ_CAP, ReadError, read_file
from reconciler.client import Client
from reconciler.errors import NotFound
from reconciler.exec import ExecError, ExecTimeout, exec_command

PAYLOAD = bytes(range(256)) * 8192 + b"\x00\r\n\xff tail"  # every byte value, 2 MiB and a bit


@pytest.fixture
async def pod(cluster: LocalCluster, client: Client, namespace: str) -> tuple[str, str, Path]:
    await run_pod(client, namespace, "exec-target")
    workdir = cluster.exec_dir(namespace, "exec-target")
    (workdir / "blob.bin").write_bytes(PAYLOAD)
    await wait_exec_ready(client, namespace, "exec-target")
    return namespace, "exec-target", workdir


async def test_exact_bytes_over_one_mebibyte(client: Client, pod: tuple[str, str, Path]) -> None:
    ns, name, _ = pod
    r = await exec_command(client, ns, name, ["cat", "blob.bin"], max_bytes=4 << 20)
    assert r.protocol == "v5.channel.k8s.io"
    assert len(r.stdout) == len(PAYLOAD) and r.stdout == PAYLOAD
    assert not r.stdout_truncated and r.stderr == b"" and r.exit_code == 0


@pytest.mark.parametrize("protocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
async def test_each_protocol_alone_through_the_api_server(
    client: Client, pod: tuple[str, str, Path], protocol: str
) -> None:
    """v5 the API server translates to SPDY; v4 it proxies to the kubelet as a websocket. The v4
    path once answered 406: our upgrade carried the client's `Accept: application/json`, which the
    node's exec handler refused (client-go sends no Accept there; neither do we now)."""
    ns, name, _ = pod
    r = await exec_command(
        client, ns, name, ["sh", "-c", "printf out; printf err >&2; exit 4"], protocols=[protocol]
    )
    assert r.protocol == protocol
    assert (r.stdout, r.stderr, r.exit_code) == (b"out", b"err", 4)


async def test_stderr_apart_and_exit_status(client: Client, pod: tuple[str, str, Path]) -> None:
    ns, name, _ = pod
    r = await exec_command(
        client, ns, name, ["sh", "-c", "printf out; printf 'err\\n' >&2; printf more; exit 3"]
    )
    assert (r.stdout, r.stderr, r.exit_code) == (b"outmore", b"err\n", 3)
    assert not r.ok


@pytest.mark.parametrize(
    ("script", "code"),
    [("exit 0", 0), ("exit 1", 1), ("exit 7", 7), ("exit 255", 255), ("kill -9 $$", 137)],
)
async def test_exit_codes(
    client: Client, pod: tuple[str, str, Path], script: str, code: int
) -> None:
    ns, name, _ = pod
    assert (await exec_command(client, ns, name, ["sh", "-c", script])).exit_code == code


async def test_argv_is_never_a_shell_string(client: Client, pod: tuple[str, str, Path]) -> None:
    ns, name, workdir = pod
    args = ["a b", "$HOME", "; touch pwned", "`id`", "'\"", "+&=%", "ü"]
    r = await exec_command(client, ns, name, ["printf", "%s|", *args])
    assert r.stdout == ("|".join(args) + "|").encode()
    assert not (workdir / "pwned").exists()
    with pytest.raises(TypeError):
        await exec_command(client, ns, name, "cat blob.bin")  # type: ignore[arg-type]


async def test_cap_keeps_the_first_bytes_and_reports_truncation(
    client: Client, pod: tuple[str, str, Path]
) -> None:
    ns, name, _ = pod
    r = await exec_command(
        client, ns, name, ["sh", "-c", "cat blob.bin; cat blob.bin >&2"], max_bytes=1000
    )
    assert r.stdout == PAYLOAD[:1000] and r.stdout_truncated
    assert r.stderr == PAYLOAD[:1000] and r.stderr_truncated
    assert r.exit_code == 0, "the rest was read and dropped, up to the exit status"


async def test_timeout_returns_partial_output(client: Client, pod: tuple[str, str, Path]) -> None:
    ns, name, _ = pod
    started = time.monotonic()
    with pytest.raises(ExecTimeout) as e:
        await exec_command(client, ns, name, ["sh", "-c", "printf early; sleep 5"], timeout=1.5)
    assert 1.4 < time.monotonic() - started < 3.5
    assert e.value.partial.stdout == b"early"


async def test_stdin_is_delivered(client: Client, pod: tuple[str, str, Path]) -> None:
    ns, name, _ = pod
    # `head -c` stops after N bytes; KWOK does not pass stdin's close on to the process (kubectl
    # exec -i hangs the same way), so the test does not depend on EOF.
    data = bytes(range(256)) * 64
    r = await exec_command(client, ns, name, ["head", "-c", str(len(data))], stdin=data)
    assert r.stdout == data and r.exit_code == 0


async def test_errors_when_the_command_cannot_run(
    client: Client, pod: tuple[str, str, Path]
) -> None:
    ns, name, _ = pod
    with pytest.raises(ExecError) as e:
        await exec_command(client, ns, name, ["no-such-command-here"])
    assert "no-such-command-here" in str(e.value)
    with pytest.raises(NotFound):
        await exec_command(client, ns, "no-such-pod", ["true"])


def _commands_in(workdir: Path, argv: list[str]) -> list[int]:
    """Pids of this host's processes running `argv` in `workdir` (KWOK runs execs locally)."""
    want = "\0".join(argv).encode() + b"\0"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/cmdline").read_bytes() == want and os.readlink(
                f"/proc/{entry}/cwd"
            ) == str(workdir):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("protocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
async def test_an_endless_command_is_closed_at_the_cap(
    client: Client, pod: tuple[str, str, Path], protocol: str
) -> None:
    """`cat /dev/zero` (a progress path that never ends) with stop_at_cap: at most the cap is
    read and the stream is closed at once, in far less than the timeout."""
    ns, name, workdir = pod
    started = time.monotonic()
    r = await exec_command(
        client,
        ns,
        name,
        ["cat", "/dev/zero"],
        max_bytes=READ_CAP,
        stop_at_cap=True,
        timeout=30,
        protocols=[protocol],
    )
    elapsed = time.monotonic() - started
    assert elapsed < 5.0, f"{elapsed:.1f}s for a 30 s timeout"
    assert r.stdout_truncated and len(r.stdout) == READ_CAP and r.stdout == bytes(READ_CAP)
    assert r.exit_code is None
    # The command itself is the node's: neither KWOK nor a real runtime ends it because the
    # client went (kubernetes/kubernetes#89031); this test started it, so it ends it.
    for pid in _commands_in(workdir, ["cat", "/dev/zero"]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_the_progress_reader_on_an_endless_file(
    client: Client, pod: tuple[str, str, Path]
) -> None:
    """The progress controller's read of /dev/zero: ProgressFileTooLarge, in far less than its
    exec timeout."""
    ns, name, _ = pod
    started = time.monotonic()
    with pytest.raises(ReadError) as e:
        await read_file(exec_command, client, ns, name, None, "/dev/zero", timeout=30)
    assert e.value.reason == "ProgressFileTooLarge"
    assert time.monotonic() - started < 5.0
