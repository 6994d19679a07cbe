"""Find the Go-built control-plane binaries, building them with hack/build-binaries.sh if needed."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

HACK = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = HACK / "build-binaries.sh"


class MissingBinaries(RuntimeError):
    """The binaries are not built and could not be built here."""


class TrainerBinaries(NamedTuple):
    """Kubeflow Trainer v2 and JobSet (kubeflow_trainer.py): binaries, their modules' manifests."""

    jobset: Path
    jobset_manifests: Path
    trainer: Path
    trainer_manifests: Path


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    training_operator: Path
    training_operator_crds: Path
    kubectl: Path
    # The real node (hack/localcluster/node.py); containerd, runc and the CNI plugins come from
    # Debian's packages.
    kubelet: Path
    kube_proxy: Path
    coredns: Path
    # Optional: what `build-binaries.sh --for demo` leaves out (the demo starts none of them), and
    # what an env file written before a component was pinned lacks. The code that starts one asks
    # for it with `require_*`, which raises MissingBinaries saying how to build it.
    # KWOK: the fake nodes (a cluster with `nodes=0`, the demo's, starts no KWOK).
    kwok: Path | None = None
    kwok_crds: Path | None = None
    kwok_stages: Path | None = None
    jobset: Path | None = None
    jobset_manifests: Path | None = None
    trainer: Path | None = None
    trainer_manifests: Path | None = None
    # The monitoring test's Prometheus (tests/support/prometheus.py).
    prometheus: Path | None = None
    # Kueue (started on demand, localcluster/kueue.py).
    kueue: Path | None = None
    kueue_manifests: Path | None = None
    # SeaweedFS's `weed`, the S3 server of the S3 tests and of the local cluster (seaweedfs.py).
    seaweedfs: Path | None = None

    def _require(self, *names: str) -> list[Path]:
        paths = [getattr(self, n) for n in names]
        missing = [n for n, p in zip(names, paths, strict=True) if p is None]
        if missing:
            keys = ", ".join("KUBECKPT_" + n.upper() for n in missing)
            raise MissingBinaries(
                f"the binaries env file names no {keys}: run `bash {BUILD_SCRIPT}` (it builds "
                "everything the tests use; `--for demo` leaves this out)"
            )
        return paths

    def require_trainer(self) -> TrainerBinaries:
        """Trainer's and JobSet's binaries and manifests, or MissingBinaries."""
        return TrainerBinaries(
            *self._require("jobset", "jobset_manifests", "trainer", "trainer_manifests")
        )

    def require_kwok(self) -> tuple[Path, Path, Path]:
        """KWOK's binary, its CRDs and its stages, or MissingBinaries."""
        binary, crds, stages = self._require("kwok", "kwok_crds", "kwok_stages")
        return binary, crds, stages

    def require_prometheus(self) -> Path:
        """Prometheus's binary, or MissingBinaries."""
        return self._require("prometheus")[0]

    def require_kueue(self) -> tuple[Path, Path]:
        """Kueue's binary and its module's manifests, or MissingBinaries."""
        binary, manifests = self._require("kueue", "kueue_manifests")
        return binary, manifests

    def require_seaweedfs(self) -> Path:
        """SeaweedFS's `weed`, or MissingBinaries."""
        return self._require("seaweedfs")[0]

    @classmethod
    def from_env_file(cls, path: Path) -> Binaries:
        values = read_env_file(path)
        found = {}
        for field in fields(cls):
            key = "KUBECKPT_" + field.name.upper()
            optional = field.default is None
            if key not in values:
                if optional:
                    continue
                raise MissingBinaries(f"{path} lacks {key}; rerun {BUILD_SCRIPT}")
            p = Path(values[key])
            if not p.exists():
                raise MissingBinaries(f"{p} ({key}) is missing; rerun {BUILD_SCRIPT}")
            found[field.name] = p
        return cls(**found)


def read_env_file(path: Path) -> dict[str, str]:
    """The KEY=value lines of a binaries env file."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            values[k.strip()] = v.strip()
    return values


SEAWEEDFS_BUILD = f"bash {BUILD_SCRIPT} --only seaweedfs"


def ensure_seaweedfs(*, build: bool = True) -> Path:
    """SeaweedFS's `weed`, building it alone if needed (`build-binaries.sh --only seaweedfs`, a
    no-op when cached): the S3 tests need it and nothing else of the cluster's binaries.

    KUBECKPT_BINARIES_ENV, when set, is read instead, like `ensure_binaries` does.
    """
    how = f"build it with `{SEAWEEDFS_BUILD}` (about 6 min cold on 2 cores) or `make binaries`"
    preset = os.environ.get("KUBECKPT_BINARIES_ENV")
    if preset:
        env = Path(preset)
    elif not build:
        raise MissingBinaries(f"SeaweedFS is not built: {how}")
    else:
        env = _build(
            "--only",
            "seaweedfs",
            failure=f"building SeaweedFS failed (exit {{rc}}; its messages are above): {how}. "
            "It needs Go and the Go module proxy.",
        )
    weed = read_env_file(env).get("KUBECKPT_SEAWEEDFS")
    if not weed:
        raise MissingBinaries(f"{env} names no KUBECKPT_SEAWEEDFS: {how}")
    if not Path(weed).exists():
        raise MissingBinaries(f"{weed} (KUBECKPT_SEAWEEDFS in {env}) is missing: {how}")
    return Path(weed)


def ensure_binaries(*, build: bool = True, purpose: str | None = None) -> Binaries:
    """Return the binaries, building missing ones (a no-op in seconds when all are cached).

    `purpose` (default: KUBECKPT_BUILD_FOR, else "all") is build-binaries.sh's `--for`: "demo"
    builds only what the demo starts. KUBECKPT_BINARIES_ENV may name an env file written by an
    earlier build to skip the script.
    """
    preset = os.environ.get("KUBECKPT_BINARIES_ENV")
    if preset:
        return Binaries.from_env_file(Path(preset))
    if not build:
        raise MissingBinaries(f"control-plane binaries not built: run {BUILD_SCRIPT}")
    purpose = purpose or os.environ.get("KUBECKPT_BUILD_FOR") or "all"
    env = _build(
        "--for",
        purpose,
        failure=f"{BUILD_SCRIPT} failed (exit {{rc}}); its messages above say what is missing. "
        "It needs Go >= 1.24 (or curl and unzip to fetch it) and the Go module proxy.",
    )
    return Binaries.from_env_file(env)


def _build(*args: str, failure: str) -> Path:
    """Run build-binaries.sh with `args` (its log on our stderr) and return the env file it
    names last, or raise MissingBinaries with `failure` ({rc}: its exit status)."""
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise MissingBinaries(failure.replace("{rc}", str(proc.returncode)))
    return Path(lines[-1])
