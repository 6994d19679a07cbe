"""SIGTERM flag and chaining, the preStop request file, and the kubeckpt-prestop hook."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainer_runtime.contract import DONE_FILE, FAILED_FILE, REQUEST_FILE
from trainer_runtime.stop import incarnation, prestop
from trainer_runtime.stop.triggers import RequestFile, SignalTrigger

REPO = Path(__file__).resolve().parents[3]


def test_sigterm_sets_the_flag_and_chains() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    trigger = SignalTrigger(signals=(signal.SIGUSR1,))
    try:
        assert trigger.install()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert trigger.fired and trigger.fired_by == signal.SIGUSR1
        assert seen == [signal.SIGUSR1]  # the handler installed before ours still ran
    finally:
        trigger.uninstall()
        signal.signal(signal.SIGUSR1, previous)


def test_sigterm_does_not_chain_to_default_action() -> None:
    code = (
        "import os, signal, time\n"
        "from trainer_runtime.stop.triggers import SignalTrigger\n"
        "t = SignalTrigger(); t.install()\n"
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.05)\n"
        "print('alive', t.fired)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "alive True"


def test_install_outside_main_thread_is_refused() -> None:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(SignalTrigger().install()))
    thread.start()
    thread.join()
    assert result == [False]


def test_request_file_pending_and_stale(tmp_path: Path) -> None:
    req = RequestFile(tmp_path)
    assert not req.pending()
    (tmp_path / REQUEST_FILE).write_text("{}")
    assert req.pending()
    old = req.not_before - 60  # left by an earlier container of the pod
    os.utime(tmp_path / REQUEST_FILE, (old, old))
    assert not req.pending()
    os.utime(tmp_path / REQUEST_FILE)
    req.acknowledge(True, {"step": 12})
    assert json.loads((tmp_path / DONE_FILE).read_text())["step"] == 12
    assert not (tmp_path / REQUEST_FILE).exists()  # answered: a restart will not stop at once


def _hook_request(directory: Path) -> dict:
    """What a preStop hook started now writes (a process of its own, as the kubelet runs it)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_runtime.prestop",
            f"--control-dir={directory}",
            "--timeout=0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == prestop.EXIT_TIMEOUT, out.stderr
    return json.loads((directory / REQUEST_FILE).read_text())


def test_a_request_from_an_earlier_container_is_not_taken_for_this_one(tmp_path: Path) -> None:
    """The emptyDir outlives a container restart: a request the earlier container's hook wrote
    is there, and fresh (its mtime is no help), but that hook started before this process."""
    req = RequestFile(tmp_path)
    me = incarnation.current()
    assert me is not None
    request = tmp_path / REQUEST_FILE
    earlier = {
        "time": time.time(),
        **incarnation.Incarnation(me.boot_id, me.start_ticks - 500).to_request(),
    }
    request.write_text(json.dumps(earlier))
    assert not req.pending()
    other_boot = {**earlier, "bootId": "0" * 8, "startTicks": me.start_ticks + 10}
    request.write_text(json.dumps(other_boot))  # before a node reboot: ticks do not compare
    assert not req.pending()
    # This container's hook, started after this process: taken, and answered.
    body = _hook_request(tmp_path)
    assert body["bootId"] == me.boot_id and body["startTicks"] >= me.start_ticks
    assert req.pending()
    req.acknowledge(True, {"step": 3})
    assert not req.pending()


def test_request_identity_ignores_the_containers_uptime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LXCFS shows a container its own /proc/uptime while /proc/self/stat counts from the host's
    boot: mixing them put this process's start hours off. /proc/uptime is not read at all."""
    import builtins

    real_open = builtins.open
    opened: list[str] = []

    def lxcfs_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(str(file))
        if str(file) == "/proc/uptime":
            return io.BytesIO(b"3.00 3.00\n")  # the container started 3 s ago
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", lxcfs_open)
    req = RequestFile(tmp_path)
    monkeypatch.setattr(builtins, "open", real_open)
    body = _hook_request(tmp_path)
    monkeypatch.setattr(builtins, "open", lxcfs_open)
    assert req.pending()
    assert req.me is not None
    stale = {**body, "startTicks": req.me.start_ticks - 1}  # a hook from before this process
    (tmp_path / REQUEST_FILE).write_text(json.dumps(stale))
    assert not req.pending()
    assert "/proc/uptime" not in opened


def test_a_request_without_an_identity_is_judged_by_its_time(tmp_path: Path) -> None:
    """The webhook's shell fallback writes `date +%s`: newer than this process counts."""
    req = RequestFile(tmp_path)
    request = tmp_path / REQUEST_FILE
    request.write_text(f"{int(time.time())}\n")
    assert req.pending()
    old = req.not_before - 3600
    os.utime(request, (old, old))
    assert not req.pending()
    assert req.not_before <= time.time() + 1


def _answer_later(directory: Path, name: str, delay: float) -> threading.Thread:
    def run() -> None:
        deadline = time.monotonic() + 10
        while not (directory / REQUEST_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        RequestFile(directory).acknowledge(name == DONE_FILE, {"step": 3})

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_prestop_done(tmp_path: Path) -> None:
    (tmp_path / DONE_FILE).write_text("stale")  # from an earlier container: must not count
    (tmp_path / FAILED_FILE).write_text("stale")
    thread = _answer_later(tmp_path, DONE_FILE, 0.2)
    start = time.monotonic()
    assert prestop.main([f"--control-dir={tmp_path}", "--timeout=10"]) == prestop.EXIT_DONE
    assert time.monotonic() - start >= 0.2
    thread.join()


def test_prestop_failed_and_timeout(tmp_path: Path) -> None:
    thread = _answer_later(tmp_path, FAILED_FILE, 0.0)
    assert prestop.main([f"--control-dir={tmp_path}", "--timeout=10"]) == prestop.EXIT_FAILED
    thread.join()
    start = time.monotonic()
    assert prestop.main([f"--control-dir={tmp_path}", "--timeout=0.3"]) == prestop.EXIT_TIMEOUT
    assert 0.3 <= time.monotonic() - start < 2


def test_prestop_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert prestop.main([f"--control-dir={blocker}/x", "--timeout=1"]) == prestop.EXIT_ERROR


def test_prestop_timeout_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECKPT_PRESTOP_TIMEOUT", raising=False)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert prestop.default_timeout() == prestop.DEFAULT_TIMEOUT
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "100")
    assert prestop.default_timeout() == 100
    monkeypatch.setenv("KUBECKPT_PRESTOP_TIMEOUT", "40")
    assert prestop.default_timeout() == 40


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = shutil.which("kubeckpt-prestop", path=str(Path(sys.executable).parent))
    assert script, "kubeckpt-prestop missing: reinstall with pip install -e '.[dev]'"
    env = {**os.environ, "CHECKPOINT_CONTROL_DIR": str(tmp_path)}
    out = subprocess.run([script, "--timeout=0"], env=env, capture_output=True, text=True)
    assert out.returncode == prestop.EXIT_TIMEOUT and (tmp_path / REQUEST_FILE).exists()


def test_sigterm_after_a_jit_stop_does_not_end_the_exit_with_143() -> None:
    # The kubelet's SIGTERM follows preStop's answer and often reaches a process that is already
    # shutting down, where the interpreter has dropped its Python signal handlers.
    code = (
        "import atexit, os, signal\n"
        "from trainer_runtime.stop.triggers import SignalTrigger\n"
        "t = SignalTrigger(); t.install(); t.uninstall(stopping=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"
        "print('alive')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "alive", out
    # Without a stop the default comes back: SIGTERM ends the process.
    code = code.replace("stopping=True", "stopping=False")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == -signal.SIGTERM, out
