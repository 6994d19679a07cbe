"""The local Kubernetes control plane used by the tests (pytest fixture) and `make cluster-up`."""

from .binaries import Binaries, MissingBinaries, ensure_binaries
from .cluster import (
    ClusterError,
    LocalCluster,
    die_with_parent,
    free_port,
    local_cluster,
    stop_process,
    sweep_stale_workdirs,
)
from .node import NodeUnavailable, host_problem
from .waiting import wait_for

__all__ = [
    "Binaries",
    "ClusterError",
    "LocalCluster",
    "MissingBinaries",
    "NodeUnavailable",
    "die_with_parent",
    "ensure_binaries",
    "free_port",
    "host_problem",
    "local_cluster",
    "stop_process",
    "sweep_stale_workdirs",
    "wait_for",
]
