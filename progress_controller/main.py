"""kubeckpt-reconciler: the progress controller (every injected job's progress in a
TrainingProgress) and the CheckpointPolicy status, leader-elected, with /healthz, /readyz and
/metrics."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from reconciler.client import Client
from reconciler.config import load_config, load_kubeconfig
from reconciler.leaderelection import LeaderElectionConfig
from reconciler.manager import Manager, install_signal_handlers
from reconciler.metrics_auth import MetricsAuth, server_tls

from .budgets import DEFAULT_FLEET, BudgetError, size_budgets
from .controller import ProgressController
from .policy_status import PolicyStatusController
from .preemption_cost import CostSettings, CostSettingsError
from .preemption_cost_controller import PreemptionCostController
from .push import PushEndpoint, serve_push
from .push_auth import PushAuth
from .schedule import ExecLimiter, PollSettings

log = logging.getLogger("kubeckpt.reconciler")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="kubeckpt-reconciler", description=__doc__)
    ap.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: in-cluster service account)",
    )
    ap.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "kubeckpt-system"),
        help="namespace of the leader-election Lease",
    )
    ap.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--lease-name", default="kubeckpt-reconciler")
    ap.add_argument("--lease-duration", type=float, default=15.0)
    ap.add_argument("--renew-deadline", type=float, default=10.0)
    ap.add_argument("--retry-period", type=float, default=2.0)
    ap.add_argument("--bind-address", default="0.0.0.0", help="for the probes and /metrics")
    ap.add_argument("--port", type=int, default=8081, help="/healthz and /readyz (plain HTTP)")
    ap.add_argument("--metrics-port", type=int, default=8443, help="/metrics")
    ap.add_argument(
        "--metrics-secure",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="HTTPS, and only for callers the API server allows to get /metrics (default); "
        "--no-metrics-secure: plain HTTP for anyone, for local development",
    )
    ap.add_argument(
        "--metrics-cert-dir",
        default="",
        help="tls.crt and tls.key for /metrics (default: a self-signed certificate)",
    )
    d = PollSettings()
    ap.add_argument("--poll-early", type=float, default=d.early, help="seconds, young jobs")
    ap.add_argument("--poll-recent", type=float, default=d.recent, help="seconds, recent steps")
    ap.add_argument("--poll-stale", type=float, default=d.stale, help="seconds, stale jobs")
    ap.add_argument("--early-window", type=float, default=d.early_window)
    ap.add_argument("--recent-window", type=float, default=d.recent_window)
    ap.add_argument("--poll-jitter", type=float, default=d.jitter)
    ap.add_argument(
        "--stall-floor",
        type=float,
        default=d.stall_floor,
        help="least seconds without a step before Stalled",
    )
    ap.add_argument(
        "--fleet-size",
        type=int,
        default=DEFAULT_FLEET,
        help="jobs to keep fresh at --poll-early: sizes every budget left unset below (execs per "
        "second and at once, the status client's QPS and burst; progress_controller/budgets.py)",
    )
    ap.add_argument(
        "--max-concurrent-execs", type=int, default=None, help="default: from --fleet-size"
    )
    ap.add_argument(
        "--max-concurrent-execs-per-namespace",
        type=int,
        default=None,
        help="execs in flight or waiting per namespace, so that one namespace's slow reads "
        "cannot hold every slot (default: half of --max-concurrent-execs)",
    )
    ap.add_argument(
        "--exec-qps",
        type=float,
        default=None,
        help="execs per second, on a client of their own (default: from --fleet-size)",
    )
    ap.add_argument("--exec-burst", type=int, default=None, help="default: from --fleet-size")
    ap.add_argument("--exec-timeout", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=16, help="reconciles at once (I/O bound)")
    ap.add_argument(
        "--cache-trim",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cache only the fields the controller reads (default); --no-cache-trim: whole "
        "objects, for comparison (docs/benchmarks.md)",
    )
    ap.add_argument(
        "--trainjob-discovery-interval",
        type=float,
        default=30.0,
        help="seconds between checks for the TrainJob API (it may be installed later)",
    )
    ap.add_argument(
        "--preemption-cost",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep Kueue's kueue.x-k8s.io/priority-boost annotation on each kubeckpt job's "
        "Workload current with what preempting it would lose (Kueue >= 0.17 with the "
        "PriorityBoost feature gate; needs the rights of "
        "config/components/kueue-preemption-cost). Off by default: it changes what Kueue preempts",
    )
    ap.add_argument(
        "--preemption-cost-max-boost",
        type=int,
        default=CostSettings().max_boost,
        help="the boost of a job whose preemption would lose a day or more; keep it below the "
        "gap between the priority classes whose order must hold",
    )
    ap.add_argument(
        "--qps",
        type=float,
        default=None,
        help="API client QPS for everything but execs (status writes, Events, lists; default: "
        "from --fleet-size)",
    )
    ap.add_argument("--burst", type=int, default=None, help="default: from --fleet-size")
    ap.add_argument(
        "--adaptive-qps",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="treat --qps and --exec-qps as ceilings: halve on the API server's 429s and recover "
        "(default); --no-adaptive-qps: fixed rates",
    )
    ap.add_argument(
        "--progress-push-port",
        type=int,
        default=0,
        help="HTTPS port of the progress push endpoint (push.py); 0: off (default)",
    )
    ap.add_argument(
        "--progress-push-cert-dir",
        default="",
        help="tls.crt and tls.key for the push endpoint (default: self-signed)",
    )
    ap.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    args = ap.parse_args(argv)
    try:
        args.cost_settings = CostSettings(max_boost=args.preemption_cost_max_boost)
    except CostSettingsError as e:
        ap.error(f"--preemption-cost-max-boost: {e}")
    try:
        sized = size_budgets(args.fleet_size, args.poll_early)
    except BudgetError as e:
        ap.error(f"--fleet-size / --poll-early: {e}")
    for name, value in (
        ("qps", sized.write_qps),
        ("burst", sized.write_burst),
        ("exec_qps", sized.exec_qps),
        ("exec_burst", sized.exec_burst),
        ("max_concurrent_execs", sized.max_concurrent_execs),
    ):
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def settings_from(args: argparse.Namespace) -> PollSettings:
    return PollSettings(
        early=args.poll_early,
        recent=args.poll_recent,
        stale=args.poll_stale,
        early_window=args.early_window,
        recent_window=args.recent_window,
        jitter=args.poll_jitter,
        stall_floor=args.stall_floor,
    )


async def run(args: argparse.Namespace) -> None:
    config = load_kubeconfig(args.kubeconfig) if args.kubeconfig else load_config()
    config.qps, config.burst = args.qps, args.burst
    config.adaptive_qps = args.adaptive_qps
    client = Client(config)
    # Execs on a client of their own: they never wait behind status writes, nor these behind them.
    exec_client = client.derived(
        qps=args.exec_qps,
        burst=args.exec_burst,
        user_agent=f"{config.user_agent} exec",
    )
    election = (
        LeaderElectionConfig(
            args.lease_name,
            args.namespace,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
        if args.leader_elect
        else None
    )
    manager = Manager(
        client,
        name="kubeckpt-reconciler",
        leader_election=election,
        host=args.bind_address,
        port=args.port,
        metrics_port=args.metrics_port,
        metrics_tls=server_tls(args.metrics_cert_dir or None) if args.metrics_secure else None,
        # Token reviews on a client and budget of their own (closed with the manager).
        metrics_auth=MetricsAuth.with_own_client(client) if args.metrics_secure else None,
    )
    progress = ProgressController(
        manager,
        settings=settings_from(args),
        limiter=ExecLimiter(
            args.max_concurrent_execs,
            args.exec_qps,
            args.exec_burst,
            per_namespace=args.max_concurrent_execs_per_namespace,
        ),
        exec_timeout=args.exec_timeout,
        workers=args.workers,
        trainjob_interval=args.trainjob_discovery_interval,
        trim=args.cache_trim,
        exec_client=exec_client,
    )
    PolicyStatusController(manager, progress.policies, progress.namespaces)
    if args.progress_push_port:
        # Token reviews on a client and budget of their own (push_auth.py).
        push = PushEndpoint(
            progress, PushAuth.with_own_client(client), registry=manager.metrics.registry
        )
        cert_dir = args.progress_push_cert_dir or None
        port = args.progress_push_port
        manager.add_runnable(
            lambda: serve_push(push, args.bind_address, port, cert_dir), leader_only=False
        )
    if args.preemption_cost:
        PreemptionCostController(manager, progress, settings=args.cost_settings)
    install_signal_handlers(manager)
    log.info(
        "starting (leader election: %s, preemption cost: %s)",
        "on" if election else "off",
        "on" if args.preemption_cost else "off",
    )
    try:
        await manager.run()
    finally:
        await exec_client.close()
        await client.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
