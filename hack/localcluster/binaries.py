"""Find the Go-built control-plane binaries, building them with hack/build-binaries.sh if needed."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path

HACK = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = HACK / "build-binaries.sh"


class MissingBinaries(RuntimeError):
    """The binaries are not built and could not be built here."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    kwok_crds: Path
    kwok_stages: Path
    training_operator: Path
    training_operator_crds: Path
    # Kubeflow Trainer v2 and JobSet (kubeflow_trainer.py): binaries and their module's manifests.
    jobset: Path
    jobset_manifests: Path
    trainer: Path
    trainer_manifests: Path
    kubectl: Path
    # The real node (hack/localcluster/node.py); containerd, runc and the CNI plugins come from
    # Debian's packages.
    kubelet: Path
    kube_proxy: Path
    coredns: Path
    # The monitoring test's Prometheus (tests/support/prometheus.py).
    prometheus: Path
    # Kueue (started on demand, localcluster/kueue.py): optional, so that an env file written
    # before Kueue was pinned still serves every other test; a test that starts Kueue without it
    # gets MissingBinaries then.
    kueue: Path | None = None
    kueue_manifests: Path | None = None

    def require_kueue(self) -> tuple[Path, Path]:
        """Kueue's binary and its module's manifests, or MissingBinaries."""
        if self.kueue is None or self.kueue_manifests is None:
            raise MissingBinaries(
                f"the binaries env file names no Kueue (KUBECKPT_KUEUE): rerun {BUILD_SCRIPT}"
            )
        return self.kueue, self.kueue_manifests

    @classmethod
    def from_env_file(cls, path: Path) -> Binaries:
        values: dict[str, str] = {}
        for line in path.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                k, v = line.split("=", 1)
                values[k.strip()] = v.strip()
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


def ensure_binaries(*, build: bool = True) -> Binaries:
    """Return the binaries, building missing ones (a no-op in seconds when all are cached).

    KUBECKPT_BINARIES_ENV may name an env file written by an earlier build to skip the script.
    """
    preset = os.environ.get("KUBECKPT_BINARIES_ENV")
    if preset:
        return Binaries.from_env_file(Path(preset))
    if not build:
        raise MissingBinaries(f"control-plane binaries not built: run {BUILD_SCRIPT}")
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise MissingBinaries(
            f"{BUILD_SCRIPT} failed (exit {proc.returncode}); its messages above say what is "
            "missing. It needs Go >= 1.24 (or curl and unzip to fetch it) and the Go module proxy."
        )
    return Binaries.from_env_file(Path(lines[-1]))
