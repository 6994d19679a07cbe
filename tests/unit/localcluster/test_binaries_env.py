"""Reading the binaries env file: every binary is required but Kueue's, so that an env file
written before Kueue was pinned still serves the tests that do not start Kueue."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localcluster.binaries import Binaries, MissingBinaries

REQUIRED = [f.upper() for f in Binaries.__dataclass_fields__ if not f.startswith("kueue")]


def _env(tmp_path: Path, names: list[str]) -> Path:
    lines = []
    for name in names:
        target = tmp_path / name.lower()
        target.touch()
        lines.append(f"KUBECKPT_{name}={target}")
    env = tmp_path / "binaries.env"
    env.write_text("\n".join(lines) + "\n")
    return env


def test_an_env_file_without_kueue_still_reads(tmp_path: Path) -> None:
    binaries = Binaries.from_env_file(_env(tmp_path, REQUIRED))
    assert binaries.kueue is None and binaries.kueue_manifests is None
    assert binaries.etcd == tmp_path / "etcd"
    with pytest.raises(MissingBinaries, match="KUBECKPT_KUEUE"):
        binaries.require_kueue()


def test_kueue_is_read_when_named(tmp_path: Path) -> None:
    binaries = Binaries.from_env_file(_env(tmp_path, [*REQUIRED, "KUEUE", "KUEUE_MANIFESTS"]))
    assert binaries.require_kueue() == (tmp_path / "kueue", tmp_path / "kueue_manifests")


def test_a_named_binary_that_is_missing_is_refused(tmp_path: Path) -> None:
    env = _env(tmp_path, [*REQUIRED, "KUEUE"])
    (tmp_path / "kueue").unlink()
    with pytest.raises(MissingBinaries, match="KUBECKPT_KUEUE"):
        Binaries.from_env_file(env)


@pytest.mark.parametrize("missing", ["ETCD", "TRAINER", "PROMETHEUS"])
def test_every_other_binary_is_required(tmp_path: Path, missing: str) -> None:
    env = _env(tmp_path, [n for n in REQUIRED if n != missing])
    with pytest.raises(MissingBinaries, match=f"KUBECKPT_{missing}"):
        Binaries.from_env_file(env)


def test_the_build_script_writes_exactly_the_fields_read_here() -> None:
    hack = Path(__file__).resolve().parents[3] / "hack"
    script = (hack / "build-binaries.sh").read_text()
    written = set(re.findall(r"^KUBECKPT_([A-Z_]+)=", script, flags=re.MULTILINE))
    assert written == {f.upper() for f in Binaries.__dataclass_fields__}
    # The env file's name is keyed by every pinned version, Kueue's too.
    (name,) = re.findall(r'envfile="\$CACHE/binaries-(.*)\.env"', script)
    versions = re.findall(r"^([A-Z_]+_VERSION)=", (hack / "versions.env").read_text(), re.M)
    pinned = {v for v in versions if not v.startswith("GO_")}  # the toolchain builds, not runs
    assert set(re.findall(r"\$([A-Z_]+_VERSION)", name)) == pinned
