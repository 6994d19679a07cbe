"""Reading the binaries env file: what the demo starts is required; the rest (KWOK, Trainer and
JobSet, Prometheus, Kueue, SeaweedFS) is optional, so that `build-binaries.sh --for demo` and an
env file written before Kueue was pinned still serve what does not start them, and asked for where
it starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localcluster.binaries import Binaries, MissingBinaries, ensure_seaweedfs

OPTIONAL = ["JOBSET", "JOBSET_MANIFESTS", "TRAINER", "TRAINER_MANIFESTS", "PROMETHEUS"]
OPTIONAL += ["KUEUE", "KUEUE_MANIFESTS", "KWOK", "KWOK_CRDS", "KWOK_STAGES", "SEAWEEDFS"]
REQUIRED = [f.upper() for f in Binaries.__dataclass_fields__ if f.upper() not in OPTIONAL]


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


def test_seaweedfs_is_optional_and_read_when_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without = _env(tmp_path, REQUIRED)
    with pytest.raises(MissingBinaries, match="KUBECKPT_SEAWEEDFS"):
        Binaries.from_env_file(without).require_seaweedfs()
    # The S3 tests read only SeaweedFS's line, and say how to build it alone when it is absent.
    monkeypatch.setenv("KUBECKPT_BINARIES_ENV", str(without))
    with pytest.raises(MissingBinaries, match=r"build-binaries\.sh --only seaweedfs"):
        ensure_seaweedfs()
    (tmp_path / "only").mkdir()
    only = _env(tmp_path / "only", ["SEAWEEDFS"])  # what `--only seaweedfs` writes on a new machine
    monkeypatch.setenv("KUBECKPT_BINARIES_ENV", str(only))
    assert ensure_seaweedfs() == tmp_path / "only" / "seaweedfs"
    (tmp_path / "only" / "seaweedfs").unlink()
    with pytest.raises(MissingBinaries, match="is missing"):
        ensure_seaweedfs()
    monkeypatch.delenv("KUBECKPT_BINARIES_ENV")
    with pytest.raises(MissingBinaries, match="not built"):
        ensure_seaweedfs(build=False)


def test_a_named_binary_that_is_missing_is_refused(tmp_path: Path) -> None:
    env = _env(tmp_path, [*REQUIRED, "KUEUE"])
    (tmp_path / "kueue").unlink()
    with pytest.raises(MissingBinaries, match="KUBECKPT_KUEUE"):
        Binaries.from_env_file(env)


def test_a_demo_env_file_reads_and_refuses_what_it_lacks(tmp_path: Path) -> None:
    binaries = Binaries.from_env_file(_env(tmp_path, REQUIRED))
    assert binaries.kubelet == tmp_path / "kubelet"
    with pytest.raises(MissingBinaries, match=r"KUBECKPT_JOBSET.*KUBECKPT_TRAINER_MANIFESTS"):
        binaries.require_trainer()
    with pytest.raises(MissingBinaries, match="KUBECKPT_PROMETHEUS"):
        binaries.require_prometheus()
    # The demo's cluster has no KWOK node: KWOK is asked for only by a cluster that has some.
    with pytest.raises(MissingBinaries, match=r"KUBECKPT_KWOK.*KUBECKPT_KWOK_STAGES"):
        binaries.require_kwok()
    full = Binaries.from_env_file(_env(tmp_path, [*REQUIRED, *OPTIONAL]))
    assert full.require_trainer().trainer_manifests == tmp_path / "trainer_manifests"
    assert full.require_prometheus() == tmp_path / "prometheus"
    kwok = ("kwok", "kwok_crds", "kwok_stages")
    assert full.require_kwok() == tuple(tmp_path / n for n in kwok)


@pytest.mark.parametrize("missing", ["ETCD", "KUBELET", "TRAINING_OPERATOR", "COREDNS"])
def test_every_other_binary_is_required(tmp_path: Path, missing: str) -> None:
    env = _env(tmp_path, [n for n in REQUIRED if n != missing])
    with pytest.raises(MissingBinaries, match=f"KUBECKPT_{missing}"):
        Binaries.from_env_file(env)


def test_the_build_script_writes_exactly_the_fields_read_here() -> None:
    hack = Path(__file__).resolve().parents[3] / "hack"
    script = (hack / "build-binaries.sh").read_text()
    written = set(re.findall(r"^\s*env_line KUBECKPT_([A-Z_]+) ", script, flags=re.MULTILINE))
    written |= set(re.findall(r'^\s*echo "KUBECKPT_([A-Z_]+)=', script, flags=re.MULTILINE))
    assert written == {f.upper() for f in Binaries.__dataclass_fields__}
    # The env file's name is keyed by every pinned version, Kueue's too.
    (name,) = re.findall(r'envfile="\$CACHE/binaries-(.*)\.env"', script)
    versions = re.findall(r"^([A-Z_]+_VERSION)=", (hack / "versions.env").read_text(), re.M)
    pinned = {v for v in versions if not v.startswith("GO_")}  # the toolchain builds, not runs
    assert set(re.findall(r"\$([A-Z_]+_VERSION)", name)) == pinned
