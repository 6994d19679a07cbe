"""The zero-code `sitecustomize` hook across Python versions, with stand-ins for transformers and
the runtime (no torch): how it finds and patches `transformers.trainer`, what it leaves alone, and
what it does on a Python older than the runtime needs.

Every interpreter found on this machine (pyenv's, /usr/bin's) is used, the running one always.
The real HF Trainer under torchrun is in tests/runtime/hf/test_zerocode.py.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_runtime.zerocode import HOOK_DIR
from trainer_runtime.zerocode.install import install


def _interpreters() -> dict[str, str]:
    """(major, minor) -> an executable, for every CPython 3 found; the running one included."""
    found = {f"{sys.version_info[0]}.{sys.version_info[1]}": sys.executable}
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    candidates += sorted(glob.glob("/usr/bin/python3.[0-9]*"))
    for exe in candidates:
        if exe.endswith("-config") or not os.access(exe, os.X_OK):
            continue
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        found.setdefault(out, exe)
    return found


INTERPRETERS = _interpreters()
SUPPORTED = sorted((v for v in INTERPRETERS if tuple(map(int, v.split("."))) >= (3, 11)), key=str)
OLD = sorted((v for v in INTERPRETERS if tuple(map(int, v.split("."))) < (3, 11)), key=str)

FAKE_TRAINER = '''
class Trainer:
    """The stand-in Trainer."""

    def __init__(self, name):
        self.name = name


def helper():
    return 42
'''
FAKE_RUNTIME = """
import os
CALLS = []

def kubeckpt_trainer(trainer, exit_on_stop=False):
    if os.environ.get("FAKE_FAIL"):
        raise RuntimeError("attach failed")
    CALLS.append(trainer.name)
    # Zero-code mode ends the process after a stop: the hook must ask for that.
    trainer.kubeckpt = "attached" if exit_on_stop else "attached, train() returns after a stop"
    return trainer
"""
SCRIPT = """
import inspect, json, sys
before = [type(f).__name__ for f in sys.meta_path]
from transformers.trainer import Trainer, helper
import transformers.trainer as mod

class Sub(Trainer):
    def __init__(self, name):
        super().__init__(name)
        self.sub = True

t, s = Trainer("base"), Sub("sub")
try:
    from trainer_runtime.hf import CALLS
except ImportError:
    CALLS = None
print(json.dumps({
    "finder_before": "_TrainerFinder" in before,
    "finder_after": any(type(f).__name__ == "_TrainerFinder" for f in sys.meta_path),
    "attached": [getattr(t, "kubeckpt", None), getattr(s, "kubeckpt", None)],
    "calls": CALLS,
    "sub": s.sub,
    "helper": helper(),
    "loader": type(mod.__loader__).__name__,
    "spec_loader": type(mod.__spec__.loader).__name__,
    "source": "The stand-in Trainer." in inspect.getsource(Trainer),
    "init_name": Trainer.__init__.__name__,
}))
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zerocode-hook")
    install(root / "runtime")
    fake = root / "fake"
    (fake / "transformers").mkdir(parents=True)
    (fake / "transformers" / "__init__.py").write_text("")
    (fake / "transformers" / "trainer.py").write_text(FAKE_TRAINER)
    (fake / "trainer_runtime" / "hf").mkdir(parents=True)
    (fake / "trainer_runtime" / "__init__.py").write_text("")
    (fake / "trainer_runtime" / "hf" / "__init__.py").write_text(FAKE_RUNTIME)
    (root / "script.py").write_text(SCRIPT)
    return root


def _run(
    exe: str, tree: Path, code: str | None = None, *flags: str, **env: str
) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CHECKPOINT_", "PYTHON"))}
    base.update(env)
    argv = [exe, *flags, "-c", code] if code is not None else [exe, str(tree / "script.py")]
    return subprocess.run(
        argv, env=base, cwd=tree, capture_output=True, text=True, timeout=60, check=False
    )


def _hooked(tree: Path, *extra: Path) -> str:
    # The hook only, then the stand-ins (in place of the installed runtime and transformers).
    return os.pathsep.join(map(str, [tree / "runtime" / HOOK_DIR, tree / "fake", *extra]))


@pytest.mark.parametrize("version", SUPPORTED)
def test_patches_trainer_once_per_instance_and_gets_out_of_the_way(
    tree: Path, version: str
) -> None:
    got = _run(INTERPRETERS[version], tree, PYTHONPATH=_hooked(tree), CHECKPOINT_ENABLED="true")
    assert got.returncode == 0 and got.stderr == "", got.stderr
    out = json.loads(got.stdout)
    assert out["finder_before"] and not out["finder_after"]
    assert out["attached"] == ["attached", "attached"] and out["calls"] == ["base", "sub"]
    assert out["sub"] is True and out["helper"] == 42  # the module and subclass work as written
    assert out["loader"] == out["spec_loader"] == "SourceFileLoader"  # the real loader, given back
    assert out["source"] and out["init_name"] == "__init__"


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("enabled", ["false", ""])
def test_disabled_installs_nothing(tree: Path, version: str, enabled: str) -> None:
    env = {"PYTHONPATH": _hooked(tree)}
    if enabled:
        env["CHECKPOINT_ENABLED"] = enabled
    got = _run(INTERPRETERS[version], tree, **env)
    assert got.returncode == 0 and got.stderr == "", got.stderr
    out = json.loads(got.stdout)
    assert not out["finder_before"] and out["attached"] == [None, None] and out["calls"] == []


@pytest.mark.parametrize("version", SUPPORTED)
def test_a_failing_attach_warns_once_and_the_program_goes_on(tree: Path, version: str) -> None:
    got = _run(
        INTERPRETERS[version],
        tree,
        PYTHONPATH=_hooked(tree),
        CHECKPOINT_ENABLED="true",
        FAKE_FAIL="1",
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["attached"] == [None, None]
    lines = got.stderr.splitlines()
    assert len(lines) == 1 and "attach failed" in lines[0], got.stderr
    assert lines[0].startswith("kubeckpt: zero-code instrumentation: not attached to Trainer")


# Without an old interpreter here, the running one pretends to be 3.8 (site off, hook by hand).
SIMULATED = "3.8-simulated"


@pytest.mark.parametrize("version", OLD or [SIMULATED])
def test_old_python_warns_once_when_enabled_and_runs_unchanged(tree: Path, version: str) -> None:
    code = "import sys; print(sum(range(10)), 'transformers' in sys.modules)"
    exe = INTERPRETERS.get(version, sys.executable)
    if version == SIMULATED:
        hook = str(tree / "runtime" / HOOK_DIR)
        code = (
            "import sys; sys.version_info = (3, 8, 0, 'final', 0); sys.version = '3.8.0'; "
            f"sys.path.insert(0, {hook!r}); import sitecustomize; " + code
        )
        exe_args = ["-S"]
        version = "3.8.0"
    else:
        exe_args = []
    plain = _run(exe, tree, code, *exe_args)
    on = _run(exe, tree, code, *exe_args, PYTHONPATH=_hooked(tree), CHECKPOINT_ENABLED="1")
    off = _run(exe, tree, code, *exe_args, PYTHONPATH=_hooked(tree))
    assert plain.returncode == on.returncode == off.returncode == 0, (on.stderr, off.stderr)
    assert plain.stdout == on.stdout == off.stdout == "45 False\n"
    assert off.stderr == plain.stderr == ""
    assert on.stderr.count("\n") == 1 and f"this is {version}" in on.stderr, on.stderr


@pytest.mark.parametrize("version", sorted(INTERPRETERS, key=str))
def test_user_sitecustomize_chained_on_every_python(tree: Path, version: str) -> None:
    user = tree / f"user-{version}"
    user.mkdir(exist_ok=True)
    (user / "sitecustomize.py").write_text("import sys\nsys.stdout.write('user-site\\n')\n")
    code = "import sitecustomize; print(sitecustomize.__file__)"
    got = _run(
        INTERPRETERS[version],
        tree,
        code,
        PYTHONPATH=_hooked(tree, user),
        CHECKPOINT_ENABLED="false",
    )
    assert got.returncode == 0 and got.stderr == "", got.stderr
    assert got.stdout.splitlines() == ["user-site", str(user / "sitecustomize.py")]
