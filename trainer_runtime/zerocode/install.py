"""`python -m trainer_runtime.zerocode.install DEST`: what the zero-code init container runs.

Copies this `trainer_runtime` package (source only, no bytecode caches) to `DEST/trainer_runtime`
and the `sitecustomize` hook to `DEST/kubeckpt-hook/`, world-readable, so the training container
can use them whatever user it runs as. Everything is written into a staging directory under DEST
first and renamed into place, the package before the hook: a rerun of the init container (or a
crash half-way) never leaves a hook that points at a half-copied package.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import HOOK_DIR, HOOK_MODULE, PACKAGE

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


def _source() -> Path:
    return Path(__file__).resolve().parents[1]  # .../trainer_runtime


def _make_readable(top: Path) -> None:
    # Files 0644 and directories 0755 whatever the image's umask: the training container may run
    # as any uid, and the mount is read-only there.
    os.chmod(top, 0o755)
    for dirpath, dirnames, filenames in os.walk(top):
        for d in dirnames:
            os.chmod(Path(dirpath, d), 0o755)
        for f in filenames:
            os.chmod(Path(dirpath, f), 0o644)


def install(dest: str | os.PathLike[str]) -> Path:
    """Install the package and the hook into `dest`; returns `dest` as a Path."""
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    source = _source()
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        shutil.copytree(source, staging / PACKAGE, ignore=_IGNORE)
        (staging / HOOK_DIR).mkdir()
        shutil.copyfile(source / "zerocode" / HOOK_MODULE, staging / HOOK_DIR / HOOK_MODULE)
        _make_readable(staging)
        for name in (PACKAGE, HOOK_DIR):  # the package first: the hook must never lack it
            target = root / name
            old = None
            if target.exists():
                old = root / f".old-{name}-{os.getpid()}"
                os.rename(target, old)
            os.rename(staging / name, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m trainer_runtime.zerocode.install", description=__doc__
    )
    ap.add_argument("dest", help="directory to install into (the shared emptyDir)")
    args = ap.parse_args(argv)
    from .. import __version__

    root = install(args.dest)
    print(f"kubeckpt {__version__}: zero-code runtime installed into {root}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
