"""The `kubeckpt` and `kubectl-kubeckpt` console scripts (one entry point; kubectl runs the latter
for `kubectl kubeckpt ...`).

Options follow kubectl's: -n/--namespace, -A/--all-namespaces, --kubeconfig, --context,
-o table|json|yaml, accepted before or after the command. Every failure is one line on stderr
and an exit code (errors.EXIT_CODES_HELP); never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from kubeckpt_api import __version__
from kubeckpt_api.jobkinds import JOB_KINDS

from .errors import (
    EXIT_CODES_HELP,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VERIFY_FAILED,
    CliError,
)
from .output import FORMATS

# The job kinds served (kubeckpt_api.jobkinds): `--kind` picks one of same-named jobs.
KINDS = tuple(k.kind for k in JOB_KINDS)

PROG = "kubeckpt"


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On the subcommands the defaults are SUPPRESS, so an option given before the command is not
    # overwritten by the subcommand's default (argparse's known trap).
    d = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
    g = parser.add_argument_group("cluster options (as kubectl)")
    g.add_argument("-n", "--namespace", default=d(None), help="the namespace (default: context's)")
    g.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=d(False),
        help="every namespace (status only)",
    )
    g.add_argument("--kubeconfig", default=d(None), help="kubeconfig file (default: $KUBECONFIG)")
    g.add_argument("--context", default=d(None), help="kubeconfig context to use")
    g.add_argument(
        "-o", "--output", choices=FORMATS, default=d("table"), help="output format (table)"
    )
    g.add_argument(
        "--kind",
        choices=KINDS,
        default=d(None),
        help="the job's kind, when jobs of several kinds share its name (status: only that kind)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Training jobs served by kubeckpt: progress, checkpoints, what was injected.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p, top=True)
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser(
        "status",
        help="progress of one job or of every job",
        description="Progress of the jobs, from their TrainingProgress objects.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("job", nargs="?", help="the job (default: every job in the namespace)")
    s.add_argument(
        "-w", "--watch", action="store_true", help="live view with a progress bar; Ctrl-C exits"
    )
    _common(s, top=False)

    c = sub.add_parser(
        "checkpoints",
        help="every checkpoint of a job, listed in its rank-0 pod",
        description="Every checkpoint of the job (both tiers), listed inside its running rank-0 "
        "pod with `python -m trainer_runtime.listing` over pods/exec. Without a running rank-0 "
        "pod (the job ended or was deleted: then give --kind), a short-lived read-only lister "
        "pod mounts the job's storage (a pvc:// CheckpointPolicy's claim) and lists it; "
        "--storage PATH lists a local path instead, without the cluster.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("job")
    c.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the listing (30)"
    )
    c.add_argument(
        "--storage",
        metavar="PATH",
        help="list this local path, no cluster: the policy's storage root (the job's "
        "<namespace>/<job> directory below it is used) or the job's own directory",
    )
    c.add_argument(
        "--verify",
        action="store_true",
        help="also check every checkpoint's content against its manifest, as resume does "
        "(reads every byte: give a longer --timeout for large checkpoints); prints OK or why "
        f"per checkpoint, exit {EXIT_VERIFY_FAILED} when one fails",
    )
    c.add_argument(
        "--policy",
        help="the CheckpointPolicy whose storage a lister pod mounts (default: the namespace's "
        "only one, or the one holding the latest checkpoint recorded)",
    )
    c.add_argument(
        "--image",
        help="the lister pod's image, one with kubeckpt's runtime, and fsspec/s3fs for an "
        "s3:// policy (default: $KUBECKPT_RUNTIME_IMAGE, else the webhook's default runtime "
        "image)",
    )
    _common(c, top=False)

    d = sub.add_parser(
        "describe",
        help="conditions, pods, injected settings and Events of a job",
        description="A job's progress and conditions, its pods with what kubeckpt injected into "
        "them, and its Events.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("job")
    _common(d, top=False)
    return p


def _storage_namespace(args: argparse.Namespace) -> str:
    """-n, else the kubeconfig context's namespace when there is a kubeconfig, else "default"
    (kubectl's): `--storage` needs no cluster."""
    from .connection import resolve

    if args.namespace:
        return str(args.namespace)
    try:
        return resolve(args.kubeconfig, args.context).namespace or "default"
    except CliError:
        return "default"


async def _run(args: argparse.Namespace) -> int:
    from .checkpoints import checkpoints, checkpoints_in_storage
    from .cluster import Cluster
    from .connection import client_for, resolve
    from .describe import describe
    from .status import status
    from .watch import watch

    if getattr(args, "storage", None) is not None:
        return await checkpoints_in_storage(
            args.storage,
            _storage_namespace(args),
            args.job,
            args.output,
            kind=args.kind,
            verify=args.verify,
        )
    target = resolve(args.kubeconfig, args.context)
    namespace = None if args.all_namespaces else (args.namespace or target.namespace)
    async with client_for(target) as client:
        cluster = Cluster(client, target)
        kind = args.kind
        if args.command == "status":
            job = args.job
            if args.watch:
                return await watch(cluster, namespace, job, kind=kind)
            return await status(cluster, namespace, job, args.output, kind=kind)
        assert namespace is not None
        if args.command == "checkpoints":
            return await checkpoints(
                cluster,
                namespace,
                args.job,
                args.output,
                timeout=args.timeout,
                kind=kind,
                policy=args.policy,
                image=args.image,
                verify=args.verify,
            )
        return await describe(cluster, namespace, args.job, args.output, kind=kind)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)  # exits 2 on a usage error
    if args.all_namespaces:
        if args.command != "status":
            p.error(f"{args.command} takes one job: give -n NAMESPACE, not -A")
        if args.job:
            p.error("a job name needs one namespace: give -n NAMESPACE, not -A")
    if getattr(args, "storage", None) is not None and (args.policy or args.image):
        p.error("--storage reads a local path: --policy and --image are for a lister pod")
    if getattr(args, "timeout", 1.0) <= 0:
        p.error("--timeout must be positive")
    if getattr(args, "watch", False) and args.output != "table":
        p.error("--watch draws a live table: it cannot be combined with -o json/yaml")
    watching = getattr(args, "watch", False)
    try:
        return asyncio.run(_run(args))
    except CliError as e:
        print(f"{PROG}: {e.message}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        # Ctrl-C is how --watch ends: a clean exit; elsewhere, the shell's convention.
        return EXIT_OK if watching else EXIT_INTERRUPTED
    except BrokenPipeError:  # `kubeckpt status | head`: quiet, and no second error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # a bug, not a user error: one line, and how to see more
        print(f"{PROG}: unexpected {type(e).__name__}: {e} (please report it)", file=sys.stderr)
        return EXIT_ERROR


__all__ = ["EXIT_USAGE", "main", "parser"]
