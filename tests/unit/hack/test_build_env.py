"""The Go build settings `hack/build-binaries.sh` exports to every build (sourced, as its own
lanes see them): GOGC 400 unless the user set one (docs/benchmarks.md, Session 16: 23 % less
compiler CPU), no DWARF, and the local toolchain only."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "build-binaries.sh"


def _exported(tmp_path: Path, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    out = subprocess.run(
        ["bash", "-c", f'source "{SCRIPT}" && env'],
        env={**base, "KUBECKPT_CACHE": str(tmp_path / "cache"), **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_go_builds_collect_garbage_less_often_by_default(tmp_path: Path) -> None:
    env = _exported(tmp_path)
    assert env["GOGC"] == "400"
    assert "-dwarf=false" in env["GOFLAGS"] and env["GOTOOLCHAIN"] == "local"


def test_a_users_gogc_is_kept(tmp_path: Path) -> None:
    assert _exported(tmp_path, GOGC="150")["GOGC"] == "150"
    assert _exported(tmp_path, GOGC="off")["GOGC"] == "off"
