"""The local Kubernetes control plane used by the tests (pytest fixture) and `make cluster-up`."""

from .binaries import Binaries, MissingBinaries, ensure_binaries
from .cluster import LocalCluster, local_cluster, sweep_stale_workdirs
from .node import NodeUnavailable, host_problem
from .processes import ClusterError, die_with_parent, free_port, stop_process
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
