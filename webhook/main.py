"""`kubeckpt-webhook`: the admission server process.

    kubeckpt-webhook [--kubeconfig PATH] [--bind-address 0.0.0.0] [--port 9443]
                     [--cert-mode self|files] [--cert-dir DIR]
                     [--service kubeckpt-webhook] [--namespace kubeckpt-system]
                     [--webhook-config kubeckpt-webhook] [--extra-ip 127.0.0.1]
                     [--runtime-image kubeckpt/kubeckpt:<version>]
                     [--client-ca-file FILE [--client-allowed-names NAME]]
                     [--progress-push-ca-file FILE] ...

In-cluster it reads the service-account token; with --kubeconfig it uses that file. It serves
/mutate, /healthz, /readyz and /metrics over TLS on one port; /metrics only to callers the API
server allows to get it (--no-metrics-auth: to anyone); /mutate, with --client-ca-file, only to
the API server (its client certificate), else to anyone who reaches the port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from reconciler.admission import (
    CertManager,
    ClientCAFile,
    ClientCertAuth,
    ClientSecretStore,
    FileCertSource,
    ServingTLS,
)
from reconciler.client import Client
from reconciler.metrics_auth import MetricsAuth

from .certs import FIELD_MANAGER, SECRET_NAME, WEBHOOK_CONFIGURATION, cert_config
from .informer_view import InformerView
from .mutation import DEFAULT_RUNTIME_IMAGE
from .push_ca import PushCAFile
from .server import Metrics, make_app, serve

log = logging.getLogger("kubeckpt.webhook")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="kubeckpt-webhook",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: in-cluster service account)",
    )
    ap.add_argument("--bind-address", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=9443)
    ap.add_argument(
        "--cert-mode",
        choices=["self", "files"],
        default="self",
        help="self: CA and certificate kept in a Secret; files: mounted by cert-manager",
    )
    ap.add_argument(
        "--cert-dir",
        type=Path,
        default=Path("/etc/kubeckpt/certs"),
        help="with --cert-mode files: directory holding tls.crt and tls.key",
    )
    ap.add_argument("--service", default="kubeckpt-webhook", help="the webhook's Service name")
    ap.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "kubeckpt-system"))
    ap.add_argument("--secret", default=SECRET_NAME, help="certificate Secret")
    ap.add_argument(
        "--webhook-config",
        default=WEBHOOK_CONFIGURATION,
        help="MutatingWebhookConfiguration whose caBundle we keep (self mode)",
    )
    ap.add_argument("--extra-dns", action="append", default=[], help="extra certificate DNS SAN")
    ap.add_argument("--extra-ip", action="append", default=[], help="extra certificate IP SAN")
    ap.add_argument(
        "--runtime-image",
        default=os.environ.get("KUBECKPT_RUNTIME_IMAGE") or DEFAULT_RUNTIME_IMAGE,
        help="image of the zero-code init container (instrumentation.auto); it must hold "
        "trainer_runtime, as this controller image does (env KUBECKPT_RUNTIME_IMAGE)",
    )
    ap.add_argument(
        "--metrics-auth",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve /metrics only to callers the API server allows to get it (default); "
        "--no-metrics-auth: to anyone who reaches the port, for local development",
    )
    ap.add_argument(
        "--client-ca-file",
        type=Path,
        help="PEM CA bundle that signed the API server's webhook client certificate (its "
        "--admission-control-config-file): /mutate then answers only clients that present a "
        "certificate it signed (401 otherwise; reloaded when the file changes). /healthz, "
        "/readyz and /metrics are not affected",
    )
    ap.add_argument(
        "--client-allowed-names",
        action="append",
        default=[],
        metavar="NAME",
        help="with --client-ca-file: accept only client certificates whose common name or a DNS "
        "name is NAME (repeatable); needed when that CA also signs other clients' certificates",
    )
    ap.add_argument(
        "--progress-push-ca-file",
        type=Path,
        help="PEM CA of the progress push endpoint (the ca.crt of its CA Secret): pods whose "
        "CheckpointPolicy sets progress.push get it in the annotation "
        "kubeckpt.io/progress-push-ca, projected as their ca.crt (reloaded when the file "
        "changes). Without it, or while it is unusable, they read the ConfigMap "
        "kubeckpt-progress-ca of their namespace",
    )
    ap.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    return ap.parse_args(argv)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    tls = ServingTLS()
    tasks: list[asyncio.Task[None]] = []
    client = Client.from_kubeconfig(args.kubeconfig) if args.kubeconfig else Client.auto()
    view = InformerView(client)
    # Token reviews for /metrics on a client and budget of their own (reconciler/metrics_auth.py).
    metrics_auth = MetricsAuth.with_own_client(client) if args.metrics_auth else None
    try:
        if args.cert_mode == "self":
            certs = CertManager(
                ClientSecretStore(client, field_manager=FIELD_MANAGER),
                cert_config(
                    service=args.service,
                    namespace=args.namespace,
                    secret_name=args.secret,
                    webhook_config_name=args.webhook_config or None,
                    extra_dns_names=tuple(args.extra_dns),
                    extra_ip_addresses=tuple(args.extra_ip),
                ),
                tls,
            )
            tasks.append(asyncio.create_task(certs.run(), name="certificates"))
        else:
            source = FileCertSource(args.cert_dir, tls)
            tasks.append(asyncio.create_task(source.run(), name="certificate-files"))
        client_auth = None
        if args.client_ca_file is not None:
            client_ca = ClientCAFile(args.client_ca_file, tls)
            client_ca.load_once()
            tasks.append(asyncio.create_task(client_ca.run(), name="client-ca-file"))
            client_auth = ClientCertAuth(tls, args.client_allowed_names)
        push_ca: PushCAFile | None = None
        if args.progress_push_ca_file is not None:
            push_ca = PushCAFile(args.progress_push_ca_file)
            push_ca.load_once()
            tasks.append(asyncio.create_task(push_ca.run(), name="progress-push-ca-file"))
        await view.start()
        app = make_app(
            view,
            metrics=Metrics(),
            has_certificate=tls.has_certificate,
            runtime_image=args.runtime_image,
            metrics_auth=metrics_auth,
            client_auth=client_auth,
            push_ca=push_ca.current if push_ca is not None else (lambda: None),
        )
        await tls.wait_ready()
        runner = await serve(app, args.bind_address, args.port, tls.context)
        log.info("serving on %s:%d (%s certificates)", args.bind_address, args.port, args.cert_mode)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await view.stop()
        if metrics_auth is not None:
            await metrics_auth.close()
        await client.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(args, stop)

    asyncio.run(_main())
    return 0


if __name__ == "__main__":
    sys.exit(main())
