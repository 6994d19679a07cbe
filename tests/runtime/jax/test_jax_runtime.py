"""trainer_runtime.jax: one process and two (`jax.distributed` on localhost, one CPU device each,
gloo collectives), each process with its own ramdisk (local tier) and control directory, as two
pods would have. A run interrupted and resumed must end bitwise equal to an uninterrupted one."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from harness import finish, kill_session, start, tail_of

from tests.support.s3 import BUCKET
from trainer_runtime import layout
from trainer_runtime.contract import INCOMPLETE_SENTINEL, MANIFEST_FILE, Manifest, read_manifest
from trainer_runtime.fsutil import remove_tree
from trainer_runtime.jax import orbax_format

try:
    import orbax.checkpoint  # noqa: F401
except ImportError as e:  # a missing capability fails, saying how to get it
    raise ImportError("the JAX tests need the jax extra: pip install -e '.[dev]'") from e

JOB = Path(__file__).with_name("jax_job.py")
STEPS = 30


def _env(root: Path, k: int, **overrides: str) -> dict[str, str]:
    env = {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": str(root / "persistent"),
        "CHECKPOINT_STRATEGY": "steps",
        "CHECKPOINT_SAVE_STEPS": "7",
        "CHECKPOINT_LOCAL_DIR": str(root / f"local-{k}"),  # a ramdisk per pod
        "CHECKPOINT_LOCAL_PERIOD": "3",
        "CHECKPOINT_CONTROL_DIR": str(root / f"control-{k}"),
        "CHECKPOINT_MAX_CHECKPOINTS": "3",
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "PROGRESS_UPDATE_FREQUENCY": "1",
        "KUBECKPT_TERMINATION_LOG": str(root / f"termination-log-{k}"),
        "KUBECKPT_STAGING_DIR": str(root / f"staging-{k}"),  # a pod's own disk
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60",
        "KUBECKPT_AGREEMENT_TIMEOUT": "60",
    }
    env.update(overrides)
    return env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    root: Path,
    status: Path,
    n: int,
    *,
    steps: int = STEPS,
    sleep: float = 0.0,
    args: dict[int, list[str]] | None = None,
    **env,
):
    coordinator = f"127.0.0.1:{_port()}"
    procs = []
    for k in range(n):
        argv = [
            sys.executable,
            str(JOB),
            f"--status-dir={status}",
            f"--steps={steps}",
            f"--sleep={sleep}",
            f"--process-id={k}",
            f"--num-processes={n}",
            f"--coordinator={coordinator}",
            *(args or {}).get(k, []),
        ]
        log = root / f"{status.name}-{k}.log"
        procs.append(start(argv, _env(root, k, **env), log))
    return procs


def run(root: Path, status: Path, n: int, **kw) -> list[dict]:
    procs = launch(root, status, n, **kw)
    codes = [finish(p, timeout=240) for p in procs]
    for p, code in zip(procs, codes, strict=True):
        assert code in (0, 143), f"exit {code}:\n{tail_of(p)}"
    return [json.loads((status / f"exit-{k}.json").read_text()) for k in range(n)]


def assert_same_final(a: Path, b: Path, n: int) -> None:
    for k in range(n):
        x, y = np.load(a / f"final-{k}.npz"), np.load(b / f"final-{k}.npz")
        assert x.files == y.files
        for name in x.files:
            assert x[name].dtype == y[name].dtype and x[name].shape == y[name].shape
            assert x[name].tobytes() == y[name].tobytes(), f"process {k}, leaf {name} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Uninterrupted runs without checkpointing, for one and for two processes."""
    out = {}
    for n in (1, 2):
        root = tmp_path_factory.mktemp(f"reference-{n}")
        run(root, root / "ref", n, CHECKPOINT_ENABLED="false")
        out[n] = root / "ref"
    return out


def _progress_step(root: Path) -> int:
    try:
        return int(json.loads((root / "progress.json").read_text()).get("step", 0))
    except (OSError, ValueError):
        return 0


def _wait_for_step(root: Path, step: int, procs, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _progress_step(root) < step:
        assert all(p.poll() is None for p in procs), "a process exited early"
        assert time.monotonic() < deadline, f"step {step} not reached"
        time.sleep(0.05)


def _prestop(control: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "trainer_runtime.prestop", f"--control-dir={control}"]
    return subprocess.run(
        [*argv, f"--timeout={timeout}"], capture_output=True, text=True, timeout=timeout + 30
    )


@pytest.mark.parametrize(("n", "how"), [(1, "sigterm"), (2, "sigterm"), (2, "prestop")])
def test_a_stop_on_one_process_saves_all_at_one_step_and_resume_is_exact(
    tmp_path: Path, reference: dict[int, Path], n: int, how: str
) -> None:
    procs = launch(tmp_path, tmp_path / "a", n, sleep=0.2)
    _wait_for_step(tmp_path, 10, procs)
    # The last process's pod only: the others learn it through the agreement.
    if how == "sigterm":
        procs[-1].send_signal(signal.SIGTERM)
    else:
        hook = _prestop(tmp_path / f"control-{n - 1}")
        assert hook.returncode == 0, hook.stdout + hook.stderr  # answered: saved
    codes = [finish(p, timeout=120) for p in procs]
    infos = [json.loads((tmp_path / "a" / f"exit-{k}.json").read_text()) for k in range(n)]
    assert codes == [143] * n, [tail_of(p) for p in procs]  # preempted: the job restarts
    stops = {i["step"] for i in infos}
    assert len(stops) == 1 and all(i["stopped"] for i in infos), infos
    stop = stops.pop()
    assert 10 <= stop < STEPS
    manifest = read_manifest(tmp_path / "persistent" / f"checkpoint-{stop}")
    # orbax where several processes write one shared directory; one process: kubeckpt's format
    fmt = "orbax" if n > 1 else "local"
    assert manifest.world_size == n and manifest.extra["kubeckpt"]["format"] == fmt
    if how == "prestop":
        done = json.loads((tmp_path / f"control-{n - 1}" / "checkpoint-done").read_text())
        assert done["step"] == stop and done["checkpoint"].endswith(f"checkpoint-{stop}")

    infos = run(tmp_path, tmp_path / "b", n)
    assert {(i["resumed_from"], i["resumed_tier"]) for i in infos} == {
        (f"checkpoint-{stop}", "persistent")
    }
    assert_same_final(reference[n], tmp_path / "b", n)


def test_two_processes_resume_from_the_local_tier_and_exactly(
    tmp_path: Path, reference: dict[int, Path]
) -> None:
    run(tmp_path, tmp_path / "a", 2, steps=20)
    # Persistent every 7 steps (7, 14), the ramdisks every 3 (18 the newest, one kept each).
    assert [e.step for e in layout.scan(tmp_path / "persistent")] == [7, 14]
    for k in range(2):
        assert [e.step for e in layout.scan(tmp_path / f"local-{k}")] == [18]
        files = {f.path for f in read_manifest(tmp_path / f"local-{k}" / "checkpoint-18").files}
        assert files == {f"process-{k}.bin", f"process-{k}.json"}  # each pod's own part only
    infos = run(tmp_path, tmp_path / "b", 2)
    assert {(i["resumed_from"], i["resumed_tier"]) for i in infos} == {("checkpoint-18", "local")}
    assert_same_final(reference[2], tmp_path / "b", 2)


def test_a_recreated_job_with_resume_false_writes_a_new_generation_then_resumes_from_it(
    tmp_path: Path, reference: dict[int, Path]
) -> None:
    """Two processes (orbax persistent tier, per-pod ramdisks). Re-created with resume "false"
    (new pods: empty ramdisks), the job writes generation-1/ and leaves 7 and 14 as they were;
    re-created again with the default it resumes from generation-1, exactly."""
    persistent = tmp_path / "persistent"
    run(tmp_path, tmp_path / "a", 2, steps=20)
    before = {p: p.read_bytes() for p in persistent.rglob("*") if p.is_file()}
    for k in range(2):
        remove_tree(tmp_path / f"local-{k}")
    infos = run(tmp_path, tmp_path / "b", 2, steps=10, CHECKPOINT_RESUME="false")
    assert {i["resumed_from"] for i in infos} == {None}
    assert [(e.generation, e.step) for e in layout.scan(persistent)] == [(0, 7), (0, 14), (1, 7)]
    assert {p: p.read_bytes() for p in before} == before
    for k in range(2):
        assert read_manifest(tmp_path / f"local-{k}" / "checkpoint-9").generation == 1
        remove_tree(tmp_path / f"local-{k}")
    infos = run(tmp_path, tmp_path / "c", 2)
    assert {(i["resumed_from"], i["resumed_tier"]) for i in infos} == {
        ("generation-1/checkpoint-7", "persistent")
    }
    assert_same_final(reference[2], tmp_path / "c", 2)
    assert [e.generation for e in layout.scan(persistent) if e.step > 14] == [1, 1]
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("wiped", [(0, 1), (1,)])
def test_local_tier_wiped_restores_from_persistent(
    tmp_path: Path, reference: dict[int, Path], wiped: tuple[int, ...]
) -> None:
    """Every ramdisk wiped, or one pod's only (a replaced pod): both restore the persistent 14,
    never process 0 its local 18 and process 1 something else."""
    run(tmp_path, tmp_path / "a", 2, steps=20)
    for k in wiped:
        remove_tree(tmp_path / f"local-{k}" / "checkpoint-18")
    infos = run(tmp_path, tmp_path / "b", 2)
    assert {(i["resumed_from"], i["resumed_tier"]) for i in infos} == {
        ("checkpoint-14", "persistent")
    }
    assert_same_final(reference[2], tmp_path / "b", 2)


def test_a_corrupt_local_copy_on_one_process_makes_both_restore_the_same_step(
    tmp_path: Path, reference: dict[int, Path]
) -> None:
    run(tmp_path, tmp_path / "a", 2, steps=20)
    data = tmp_path / "local-1" / "checkpoint-18" / "process-1.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10  # same size: only the content check can tell
    data.write_bytes(bytes(raw))
    infos = run(tmp_path, tmp_path / "b", 2)
    # Process 0's copy of 18 is sound, but both must load one step: the persistent 14.
    assert {(i["resumed_from"], i["resumed_tier"]) for i in infos} == {
        ("checkpoint-14", "persistent")
    }
    assert_same_final(reference[2], tmp_path / "b", 2)


def test_sigkill_during_a_save_is_skipped_at_the_next_start(
    tmp_path: Path, reference: dict[int, Path]
) -> None:
    persistent = tmp_path / "persistent"
    for attempt in range(3):
        status = tmp_path / f"a{attempt}"
        procs = launch(tmp_path, status, 1, sleep=0.05, CHECKPOINT_LOCAL_DIR="")
        caught = None
        deadline = time.monotonic() + 120
        while caught is None and procs[0].poll() is None and time.monotonic() < deadline:
            for entry in layout.scan(persistent):
                path = persistent / f"checkpoint-{entry.step}"
                if (path / INCOMPLETE_SENTINEL).exists() and not (path / MANIFEST_FILE).exists():
                    kill_session(procs[0])  # SIGKILL, in the middle of orbax's write
                    caught = entry.step
                    break
            time.sleep(0.001)
        finish(procs[0], timeout=30)
        if (
            caught is not None
            and not (persistent / f"checkpoint-{caught}" / MANIFEST_FILE).exists()
        ):
            break
    else:
        pytest.fail("never caught a save in flight in 3 runs")
    infos = run(tmp_path, tmp_path / "b", 1, CHECKPOINT_LOCAL_DIR="")
    assert infos[0]["resumed_from"] != f"checkpoint-{caught}"
    assert not (persistent / f"checkpoint-{caught}" / INCOMPLETE_SENTINEL).exists()
    complete = [e.step for e in layout.scan(persistent) if e.complete]
    assert all((persistent / f"checkpoint-{s}" / MANIFEST_FILE).exists() for s in complete)
    assert_same_final(reference[1], tmp_path / "b", 1)


def test_two_processes_killed_while_orbax_writes_resume_exactly_and_its_staging_is_cleaned(
    tmp_path: Path, reference: dict[int, Path]
) -> None:
    """orbax's async save writes into a staging directory beside the checkpoints while training
    goes on. Both processes SIGKILLed there: the next start never sees that step, resumes
    bitwise, and its next committed save removes the leftover."""
    persistent = tmp_path / "persistent"
    staging = persistent / orbax_format.STAGING
    for attempt in range(3):
        status = tmp_path / f"a{attempt}"
        procs = launch(tmp_path, status, 2, sleep=0.05, CHECKPOINT_LOCAL_DIR="")
        caught = None
        deadline = time.monotonic() + 120
        while caught is None and all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "no save seen in 120 s"
            names = [e.name for e in staging.iterdir()] if staging.is_dir() else []
            steps = {int(n.split(".", 1)[0]) for n in names if n.split(".", 1)[0].isdigit()}
            if steps:
                for p in procs:
                    kill_session(p)  # SIGKILL, while orbax writes outside checkpoint-<step>/
                caught = max(steps)
            time.sleep(0.001)
        for p in procs:
            finish(p, timeout=30)
        if (
            caught is not None
            and not (persistent / f"checkpoint-{caught}" / MANIFEST_FILE).exists()
        ):
            break
    else:
        pytest.fail("never caught orbax's save in flight in 3 runs")
    assert caught not in [e.step for e in layout.scan(persistent) if e.complete]
    infos = run(tmp_path, tmp_path / "b", 2, CHECKPOINT_LOCAL_DIR="")
    assert {i["resumed_from"] for i in infos} != {f"checkpoint-{caught}"}
    assert_same_final(reference[2], tmp_path / "b", 2)
    newest = max(e.step for e in layout.scan(persistent) if e.complete)
    assert newest >= caught
    left = [e.name for e in staging.iterdir()]
    assert left == [], f"staging leftovers after a commit at {newest}: {left}"
    manifest = read_manifest(persistent / f"checkpoint-{newest}")
    assert manifest.extra["kubeckpt"]["format"] == "orbax"
    assert any(f.path.startswith("state/") for f in manifest.files)


def test_a_process_killed_as_an_orbax_save_starts_leaves_none_hanging_and_the_job_resumes(
    tmp_path: Path, reference: dict[int, Path]
) -> None:
    """Process 1 is SIGKILLed as its second orbax save starts (step 14), after kubeckpt agreed on
    the step and before orbax's barrier at the start of its save, where process 0 then goes. That
    barrier has no timeout of orbax's own, yet process 0 must not hang there: it ends (its gloo
    collectives fail once the peer's sockets close, and the JAX distributed service ends a
    process whose peer stopped sending heartbeats), so the pods restart and the job resumes from
    step 7, bitwise."""
    status = tmp_path / "a"
    env = {"CHECKPOINT_LOCAL_DIR": "", "KUBECKPT_AGREEMENT_TIMEOUT": "10"}
    flags = ["--heartbeat-timeout=10"]
    procs = launch(
        tmp_path, status, 2, sleep=0.05, args={0: flags, 1: [*flags, "--killed-in-save=2"]}, **env
    )
    assert finish(procs[1], timeout=240) == -signal.SIGKILL, tail_of(procs[1])
    died = time.monotonic()
    code = finish(procs[0], timeout=120)
    ended = time.monotonic() - died
    print(f"figures: process 0 ended {ended:.1f} s after process 1 died, exit {code}")
    assert code != 0 and not (status / "exit-0.json").exists(), tail_of(procs[0])
    persistent = tmp_path / "persistent"
    assert [e.step for e in layout.scan(persistent) if e.complete] == [7]
    infos = run(tmp_path, tmp_path / "b", 2, **env)
    assert [i["resumed_from"] for i in infos] == ["checkpoint-7"] * 2, infos
    assert_same_final(reference[2], tmp_path / "b", 2)


def test_orbax_leftovers_up_to_a_committed_step_are_removed_and_later_ones_kept(
    tmp_path: Path,
) -> None:
    for name in ("3", "3.orbax-checkpoint-tmp-1764201", "7", "12.orbax-checkpoint-tmp-9", "x"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_bytes(b"0")
    orbax_format._remove_stale(tmp_path, up_to=7)
    assert sorted(e.name for e in tmp_path.iterdir()) == ["12.orbax-checkpoint-tmp-9", "x"]


@pytest.mark.parametrize("n", [1, 2])
def test_s3_through_the_core_storage(tmp_path: Path, s3, reference: dict[int, Path], n: int):
    """s3:// goes through the core's S3 tier: each process writes its own part into the upload
    staging directory (orbax needs one shared directory)."""
    fs, _ = s3
    uri = f"s3://{BUCKET}/jax-{n}"
    env = {"CHECKPOINT_URI": uri, "CHECKPOINT_LOCAL_DIR": ""}
    run(tmp_path, tmp_path / "a", n, steps=20, **env)
    prefix = f"{BUCKET}/jax-{n}"
    manifest = Manifest.from_json(fs.cat(f"{prefix}/checkpoint-14/{MANIFEST_FILE}"))
    assert manifest.extra["kubeckpt"]["format"] == "local"  # orbax only into a shared directory
    for entry in manifest.files:
        assert fs.size(f"{prefix}/checkpoint-14/{entry.path}") == entry.size
    infos = run(tmp_path, tmp_path / "b", n, **env)
    assert {(i["resumed_from"], i["resumed_tier"]) for i in infos} == {
        ("checkpoint-14", "persistent")
    }
    assert_same_final(reference[n], tmp_path / "b", n)


def test_an_orbax_save_failing_on_one_process_fails_that_save_only(
    tmp_path: Path, reference: dict[int, Path]
) -> None:
    """Process 1's orbax save of step 7 fails after orbax's start barrier: process 0's orbax
    thread waits in orbax's own barrier for it. That wait ends at KUBECKPT_AGREEMENT_TIMEOUT (as
    every other collective's), not at orbax's default of 20 minutes; both processes count the
    failed save, keep training, and the later saves are complete."""
    status = tmp_path / "status"
    exits = run(
        tmp_path,
        status,
        2,
        args={1: ["--orbax-fails-at=1"]},
        KUBECKPT_AGREEMENT_TIMEOUT="10",
    )
    assert [e["failed_saves"] for e in exits] == [1, 1], exits
    assert all(e["step"] == STEPS for e in exits), exits
    persistent = tmp_path / "persistent"
    assert [(e.step, e.complete) for e in layout.scan(persistent)] == [
        (14, True),
        (21, True),
        (28, True),
    ]
    manifest = read_manifest(layout.checkpoint_path(persistent, 28))
    assert manifest.extra["kubeckpt"]["format"] == "orbax"
    assert_same_final(reference[2], status, 2)
