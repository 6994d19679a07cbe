"""What the parts of a local cluster (the real node, the Trainer stack, pod helpers, the add-on
installer) need of the cluster they belong to. They take this protocol, not `LocalCluster`, so
that cluster.py can build them without an import circle (cluster -> node -> cluster)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from .binaries import Binaries
from .processes import Process


class PortGuard(Protocol):
    """The real node's host ports that pods must not take (see node.RealNode.guard_host_port)."""

    guarded_ports: set[int]

    def guard_host_port(self, port: int) -> None: ...


class ClusterHandle(Protocol):
    binaries: Binaries | None
    workdir: Path | None
    procs: dict[str, Process]
    ports: dict[str, int]
    loopback_issuer: bool

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def server(self) -> str: ...

    @property
    def node(self) -> PortGuard | None: ...

    def kubectl(
        self,
        *args: str,
        input: str | bytes | None = None,
        check: bool = True,
        timeout: float = 60,
        text: bool = True,
    ) -> subprocess.CompletedProcess: ...

    def apply(self, manifest: str | dict | Sequence[dict], *, server_side: bool = True) -> str: ...

    def get_json(self, path: str, timeout: float = 5) -> dict: ...

    def write_kubeconfig(self, path: Path, user: str, crt: Path, key: Path) -> None: ...
