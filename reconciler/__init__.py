"""An asyncio reconciler library: the Go-free equivalent of client-go plus controller-runtime.

    client     Client (aiohttp transport, QPS limits, retries, typed errors, discovery)
    config     load_kubeconfig / load_incluster / load_config -> ClientConfig
    resources  Resource, ResourceClient (get/list/list_all/create/replace/patch/delete/apply/watch)
    informer   Informer (list+watch, 410 relist diffs, indexers, transforms), EventHandler
    workqueue  WorkQueue (client-go semantics, delays, rate limiting), ratelimit (limiters)
    fairlimit  FairLimiter: concurrency and rate shared fairly between keys (tenants)
    controller Controller, Request, Result
    manager    Manager (informers, controllers, leader election, /healthz /readyz /metrics)
    leaderelection  LeaderElector on coordination.k8s.io Leases
    events     EventRecorder (aggregated, rate-limited, non-blocking)
    apply      server-side apply of objects and /status, and when to force
    exec       exec_command over the pods/exec websocket (v5, v4)
    admission  serving an admission webhook: AdmissionReview codec, reloaded TLS, certificates
    pki        X.509: CAs, serving and self-signed certificates, parsing, renewal checks

kubeckpt's progress controller is built on it and lives beside it (progress_controller/); nothing
here imports kubeckpt's packages (tests/unit/reconciler/test_library_boundary.py).
"""

from .apply import apply, apply_status, status_patch
from .cache import Store, label_index, namespace_index, owner_index
from .client import Client, connect
from .clock import REAL_CLOCK, Clock, FakeClock, RealClock
from .config import ClientConfig, load_config, load_incluster, load_kubeconfig
from .controller import Controller, Request, Result, own_object, owner_of
from .errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    ResourceNotFound,
    ServerError,
    TooManyRequests,
    TransportError,
    Unauthorized,
)
from .events import EventRecorder
from .exec import ExecError, ExecResult, ExecTimeout, exec_command
from .fairlimit import Busy, FairLimiter
from .informer import EventHandler, Informer, enqueue_keys
from .leaderelection import LeaderElectionConfig, LeaderElector
from .manager import Manager, install_signal_handlers
from .metrics import Metrics
from .metrics_auth import MetricsAuth, server_tls
from .objects import KubeObject, object_key
from .ratelimit import (
    Backoff,
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    TokenBucket,
    default_controller_rate_limiter,
)
from .resources import Resource, ResourceClient, WatchEvent
from .workqueue import ShutDown, WorkQueue

__all__ = [
    "REAL_CLOCK",
    "AlreadyExists",
    "ApiError",
    "Backoff",
    "BadRequest",
    "BucketRateLimiter",
    "Busy",
    "Client",
    "ClientConfig",
    "Clock",
    "Conflict",
    "Controller",
    "EventHandler",
    "EventRecorder",
    "ExecError",
    "ExecResult",
    "ExecTimeout",
    "FairLimiter",
    "FakeClock",
    "Forbidden",
    "Gone",
    "Informer",
    "Invalid",
    "ItemExponentialFailureRateLimiter",
    "KubeError",
    "KubeObject",
    "LeaderElectionConfig",
    "LeaderElector",
    "Manager",
    "MaxOfRateLimiter",
    "Metrics",
    "MetricsAuth",
    "NotFound",
    "RealClock",
    "Request",
    "Resource",
    "ResourceClient",
    "ResourceNotFound",
    "Result",
    "ServerError",
    "ShutDown",
    "Store",
    "TokenBucket",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "WatchEvent",
    "WorkQueue",
    "apply",
    "apply_status",
    "connect",
    "default_controller_rate_limiter",
    "enqueue_keys",
    "exec_command",
    "install_signal_handlers",
    "label_index",
    "load_config",
    "load_incluster",
    "load_kubeconfig",
    "namespace_index",
    "object_key",
    "own_object",
    "owner_index",
    "owner_of",
    "server_tls",
    "status_patch",
]
