"""Zero-code mode end to end: the runtime installed as the webhook's init container installs it, and
unmodified scripts run with the hook on PYTHONPATH as the webhook sets it.

The HF script (zerocode_job.py: tiny Llama, LoRA through peft, no kubeckpt import) under torchrun
with 2 ranks: progress appears, SIGTERM to one rank makes both save at the same step and exit 143
(so that a job controller restarts the job; torchrun then reports its workers failed) before the
script's code after `train()` runs on either rank (test_stop_ends_script.py: the same, with a
"final" marker, single process and in library mode), the restart
resumes at that step by itself, and the LoRA parameters and loss history equal an
uninterrupted run's. Scripts that never import transformers run unchanged; an existing
sitecustomize still runs; with CHECKPOINT_ENABLED off nothing is attached.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import assert_same_files, finish, tail, torchrun, wait_for_step

from tests.support.operator_pods import pytorchjob_owner
from trainer_runtime import layout
from trainer_runtime.zerocode import HOOK_DIR, pythonpath_entries
from trainer_runtime.zerocode.install import install
from webhook.mutation import RUNTIME_DIR, mutate

JOB = Path(__file__).with_name("zerocode_job.py")
STEPS = 16  # 64 samples, 2 per rank, 2 ranks, 1 epoch
OUR_PREFIXES = ("CHECKPOINT_", "KUBECKPT_", "TRAINING_PROGRESS", "PROGRESS_UPDATE")


def _webhook_container() -> tuple[dict, dict]:
    """The init container and the training container's PYTHONPATH entry the webhook produces."""
    pod = {
        "metadata": {
            "namespace": "ns",
            "labels": {"training.kubeflow.org/job-name": "j"},
            "ownerReferences": [pytorchjob_owner("j")],  # the webhook injects the job's pods
        },
        "spec": {"containers": [{"name": "pytorch", "image": "trainer:1"}]},
    }
    policy = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"storage": {"uri": "file:///ckpt"}, "instrumentation": {"auto": True}},
    }
    namespace = {"metadata": {"name": "ns", "labels": {"kubeckpt.io/inject": "enabled"}}}
    patched = mutate(pod, policy, namespace).pod
    [init] = patched["spec"]["initContainers"]
    env = {e["name"]: e for e in patched["spec"]["containers"][0]["env"]}
    return init, env["PYTHONPATH"]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the webhook's init container leaves in the shared volume: its command, run here."""
    dest = tmp_path_factory.mktemp("zerocode") / "runtime"
    init, _ = _webhook_container()
    command = init["command"]
    assert command[0] == "python" and command[-1] == RUNTIME_DIR, command
    got = subprocess.run(
        [sys.executable, *command[1:-1], str(dest)],
        cwd=tmp_path_factory.getbasetemp(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    return dest


def _pythonpath(runtime: Path | None, *extra: Path) -> str:
    """The webhook's PYTHONPATH with the mount path replaced by `runtime`, then `extra`."""
    entries = []
    if runtime is not None:
        value = _webhook_container()[1]["value"]
        entries = [e.replace(RUNTIME_DIR, str(runtime)) for e in value.split(":")]
        assert entries == pythonpath_entries(str(runtime))  # nothing else in it
    return os.pathsep.join([*entries, *map(str, extra)])


def _env(pythonpath: str, **ours: str) -> dict[str, str]:
    """The test process's environment without any kubeckpt variable, plus `ours`.

    The repository is deliberately not on PYTHONPATH: the runtime must come from the install.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(OUR_PREFIXES)}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH"):
        env.pop(name, None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env["OMP_NUM_THREADS"] = "1"
    env.update(ours)
    return env


def _injected(root: Path) -> dict[str, str]:
    """The variables the webhook injects (paths into `root`), a time strategy that never fires."""
    return {
        "CHECKPOINT_ENABLED": "true",
        "CHECKPOINT_URI": f"file://{root / 'ckpt'}",
        "CHECKPOINT_STRATEGY": "time",
        "CHECKPOINT_INTERVAL": "3600",
        "CHECKPOINT_MAX_CHECKPOINTS": "3",
        "CHECKPOINT_RESUME": "true",
        "CHECKPOINT_JIT": "true",
        "CHECKPOINT_CONTROL_DIR": str(root / "control"),
        "TRAINING_PROGRESS_FILE": str(root / "progress.json"),
        "PROGRESS_UPDATE_FREQUENCY": "1",
        "KUBECKPT_TERMINATION_LOG": str(root / "termination-log"),
    }


def _start(argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # closed by harness.finish()
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    proc._kubeckpt_log = (out, log)  # type: ignore[attr-defined]
    return proc


def _torchrun(status: Path, output: Path, sleep: float) -> list[str]:
    return torchrun(JOB, f"--status-dir={status}", f"--output-dir={output}", f"--sleep={sleep}")


def _run_python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- the install --------------------------------------------------------------------------------


def test_install_copies_package_and_hook_world_readable_without_caches(
    runtime: Path, tmp_path: Path
) -> None:
    assert sorted(p.name for p in runtime.iterdir()) == [HOOK_DIR, "trainer_runtime"]
    assert (runtime / HOOK_DIR / "sitecustomize.py").is_file()
    for path in runtime.rglob("*"):
        assert path.name != "__pycache__" and path.suffix != ".pyc", path
        mode = path.stat().st_mode & 0o777
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))
    repo_pkg = Path(__file__).resolve().parents[3] / "trainer_runtime"
    for src in repo_pkg.rglob("*.py"):
        copied = runtime / "trainer_runtime" / src.relative_to(repo_pkg)
        assert copied.read_bytes() == src.read_bytes(), copied
    # A rerun (a restarted init container) replaces the install and leaves no staging behind.
    (runtime / "trainer_runtime" / "stale.py").write_text("")
    install(runtime)
    assert not (runtime / "trainer_runtime" / "stale.py").exists()
    assert sorted(p.name for p in runtime.iterdir()) == [HOOK_DIR, "trainer_runtime"]
    # With the webhook's PYTHONPATH the runtime is the installed copy, not the repository's.
    got = _run_python(
        "import trainer_runtime; print(trainer_runtime.__file__)",
        _env(_pythonpath(runtime)),
        tmp_path,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str(runtime / "trainer_runtime" / "__init__.py")


# --- the HF script under torchrun ---------------------------------------------------------------


@pytest.mark.timeout(600)
def test_unmodified_peft_script_saves_on_sigterm_and_resumes_exactly(
    runtime: Path, tmp_path: Path
) -> None:
    ref = tmp_path / "reference"
    proc = _start(
        _torchrun(ref / "status", ref / "out", 0.0), _env(""), tmp_path / "ref.log", tmp_path
    )
    assert finish(proc, timeout=240) == 0, tail(tmp_path / "ref.log")

    root = tmp_path / "job"
    status = root / "status"
    env = _env(_pythonpath(runtime), **_injected(root))
    first = _start(_torchrun(status, root / "out", 0.3), env, tmp_path / "first.log", tmp_path)
    wait_for_step(root / "progress.json", 3, first, timeout=240)  # progress appears
    os.kill(int((status / "pid-1").read_text()), signal.SIGTERM)  # rank 1 only
    # Each rank exits 143 after the just-in-time save, where train() ends (the script's code
    # after it never runs), and torchrun, its workers failed, exits non-zero: what makes the
    # operator restart the job.
    assert finish(first, timeout=240) != 0, tail(tmp_path / "first.log")
    assert re.search(r"exitcode\s*:\s*143", tail(tmp_path / "first.log")), tail(
        tmp_path / "first.log"
    )

    # The step each rank's Trainer ended at, recorded inside train(); nothing after it ran.
    stopped = [json.loads((status / f"train-end-{r}.json").read_text())["step"] for r in (0, 1)]
    assert not [p.name for p in status.glob("stopped-*")], tail(tmp_path / "first.log")
    assert not (status / "final.pt").exists() and not (status / "history.json").exists()
    assert stopped[0] == stopped[1] and 3 <= stopped[0] < STEPS, stopped
    step = stopped[0]
    ckpt_root = root / "ckpt"
    assert [(e.step, e.complete) for e in layout.scan(ckpt_root)] == [(step, True)]
    ckpt = ckpt_root / f"checkpoint-{step}"
    _, problems = layout.verify_checkpoint(ckpt, checksums=True)
    assert not problems, problems
    files = {f["path"] for f in json.loads((ckpt / "manifest.json").read_text())["files"]}
    for name in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "optimizer.pt",
        "trainer_state.json",
        "rng_state_0.pth",
        "rng_state_1.pth",
    ):
        assert name in files, (name, sorted(files))
    assert json.loads((root / "progress.json").read_text())["step"] == step
    # The Trainer creates its output_dir while constructed; nothing is written there after.
    assert not any((root / "out").iterdir()), "output_dir was not moved to CHECKPOINT_URI"

    second = _start(_torchrun(status, root / "out", 0.0), env, tmp_path / "second.log", tmp_path)
    assert finish(second, timeout=240) == 0, tail(tmp_path / "second.log")
    progress = json.loads((root / "progress.json").read_text())
    assert progress["resumedFrom"] == f"checkpoint-{step}"
    assert progress["step"] == STEPS
    assert_same_files(ref / "status" / "final.pt", status / "final.pt")
    expected = json.loads((ref / "status" / "history.json").read_text())
    got = json.loads((status / "history.json").read_text())
    assert [h["step"] for h in got] == list(range(1, STEPS + 1))

    def losses(history: list[dict]) -> list[tuple]:
        return [(h["step"], h["loss"], h["learning_rate"]) for h in history]

    assert losses(got) == losses(expected)
    assert "kubeckpt: zero-code" not in tail(tmp_path / "second.log", 100_000)


# --- scripts the hook must leave alone ----------------------------------------------------------

PLAIN = """
import json, sys
total = sum(i * i for i in range(1000))
print(json.dumps({"total": total, "argv": sys.argv[1:]}))
print(sorted(m for m in ("torch", "transformers", "trainer_runtime") if m in sys.modules))
"""


def test_script_without_transformers_runs_unchanged(runtime: Path, tmp_path: Path) -> None:
    without = _run_python(PLAIN, _env(""), tmp_path)
    hooked = _run_python(PLAIN, _env(_pythonpath(runtime), **_injected(tmp_path)), tmp_path)
    assert without.returncode == hooked.returncode == 0, (without.stderr, hooked.stderr)
    assert hooked.stdout == without.stdout
    assert hooked.stdout.splitlines()[-1] == "[]"  # none of them imported, even with the hook
    assert hooked.stderr == without.stderr == ""


USER_SITE = """
import os
with open(os.environ["USER_SITE_LOG"], "a") as f:
    f.write("ran\\n")
MARK = "user"
"""


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_existing_sitecustomize_is_chained_exactly_once(
    runtime: Path, tmp_path: Path, enabled: str
) -> None:
    user_site = tmp_path / "user-site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(USER_SITE)
    log = tmp_path / "user-site.log"
    env = _env(
        _pythonpath(runtime, user_site),
        CHECKPOINT_ENABLED=enabled,
        USER_SITE_LOG=str(log),
    )
    got = _run_python("import sitecustomize; print(sitecustomize.MARK)", env, tmp_path)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "user"  # the user's module is the one `import` finds
    assert log.read_text() == "ran\n"


PROBE = """
import json, sys
from transformers import Trainer, TrainingArguments
from transformers import LlamaConfig, LlamaForCausalLM

class MyTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)

model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
args = TrainingArguments(output_dir=sys.argv[1], report_to=[], use_cpu=True, save_strategy="no")
out = {}

def count(t):
    return [type(c).__name__ for c in t.callback_handler.callbacks].count("KubeckptCallback")

for cls in (Trainer, MyTrainer):
    t = cls(model=model, args=args)
    out[cls.__name__] = {
        "attached": getattr(t, "kubeckpt", None) is not None,
        "callbacks": count(t),
        "output_dir": t.args.output_dir,
    }
    if out[cls.__name__]["attached"]:  # a script that also adopts kubeckpt by hand
        from trainer_runtime.hf import kubeckpt_trainer

        out[cls.__name__]["callbacks_after_explicit"] = count(kubeckpt_trainer(t))
print(json.dumps(out))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["enabled", "disabled", "s3-uri", "unsupported-uri"])
def test_trainer_gets_the_callback_only_when_enabled(
    runtime: Path, tmp_path: Path, case: str
) -> None:
    root = tmp_path / "job"
    injected = _injected(root)
    if case == "disabled":
        injected["CHECKPOINT_ENABLED"] = "false"
    if case == "s3-uri":  # the Trainer writes into the upload staging directory
        injected["CHECKPOINT_URI"] = "s3://bucket/prefix"
        injected["KUBECKPT_STAGING_DIR"] = str(tmp_path / "staging")
    if case == "unsupported-uri":  # the HF integration cannot use it: warn once, train unchanged
        injected["CHECKPOINT_URI"] = "gs://bucket/prefix"
    code = PROBE.replace("sys.argv[1]", repr(str(tmp_path / "out")))
    got = _run_python(code, _env(_pythonpath(runtime), **injected), tmp_path)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout.splitlines()[-1])
    attached = case in ("enabled", "s3-uri")
    for name in ("Trainer", "MyTrainer"):
        assert out[name]["attached"] is attached, (name, out, got.stderr)
        assert out[name]["callbacks"] == int(attached), out
        expected_dir = str(root / "ckpt") if attached else str(tmp_path / "out")
        if case == "s3-uri":
            expected_dir = str(tmp_path / "staging" / "upload")
        assert out[name]["output_dir"] == expected_dir, out
        if attached:
            assert out[name]["callbacks_after_explicit"] == 1, out
    warnings = [line for line in got.stderr.splitlines() if "kubeckpt: zero-code" in line]
    assert len(warnings) == (1 if case == "unsupported-uri" else 0), got.stderr
