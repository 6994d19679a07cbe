"""The admission HTTP server: POST /mutate, /healthz, /readyz, /metrics (aiohttp, TLS 1.2+).

Who may call /mutate: anyone who reaches the port, unless the server verifies client certificates
(`client_auth`, the `--client-ca-file` flag): then only the API server. The README's threat model
says what an answer reveals. Failure rules: a body that is not a usable AdmissionReview gets 400
with the reason, one over 4 MiB gets 413, and anything that goes wrong inside the mutation allows
the pod unchanged with a warning (the same outcome as the configuration's failurePolicy: Ignore).
Nothing answers 500.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kubeckpt_api.jobkinds import POD_CONTROLLERS, JobIdentity, controller_reference, job_identity
from kubeckpt_api.optin import select_policy
from reconciler.admission.client_auth import ClientCertAuth
from reconciler.admission.review import BadReview, is_pod_create, parse_review, review_response
from reconciler.metrics_auth import MetricsAuth

from .mutation import DEFAULT_RUNTIME_IMAGE, MutationResult, mutate
from .view import ClusterView

log = logging.getLogger("kubeckpt.webhook")
MAX_BODY_BYTES = 4 * 1024 * 1024


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kubeckpt_webhook_requests", "Admission requests by result", ["result"], registry=r
        )
        self.latency = Histogram(
            "kubeckpt_webhook_request_duration_seconds",
            "Time to answer an admission request",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.patches = Counter(
            "kubeckpt_webhook_patches_applied", "Pods that received a patch", registry=r
        )
        self.skipped = Counter(
            "kubeckpt_webhook_skipped_fields",
            "What was not injected, and why: a field the user had set, an override above the "
            "policy's limit, or a whole pod its job does not own (field=ownership)",
            ["field"],
            registry=r,
        )
        self.errors = Counter(
            "kubeckpt_webhook_errors", "Requests answered unchanged after an error", registry=r
        )


def job_uid(job: JobIdentity, pod: Mapping[str, Any]) -> str | None:
    """The job's UID where the pod names it: a pod its job controls itself (a PyTorchJob's)."""
    if not POD_CONTROLLERS[job.kind].is_the_job:
        return None
    meta = pod.get("metadata")
    ref = controller_reference(meta) if isinstance(meta, Mapping) else None
    uid = ref.get("uid") if ref is not None else None
    return uid if isinstance(uid, str) and uid else None


def decide(
    view: ClusterView,
    request: dict[str, Any],
    runtime_image: str = DEFAULT_RUNTIME_IMAGE,
    push_ca: str | None = None,
) -> MutationResult:
    """Look up the pod's namespace, policy and job progress in the caches, then mutate."""
    pod = request["object"]
    ns_name = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    policy, warnings = select_policy(view.policies(ns_name), labels)
    job = job_identity(labels)
    progress = view.progress(ns_name, job, job_uid(job, pod)) if job else None
    # The request was parsed for this call alone and is not read again: hand the pod over to be
    # patched in place rather than copied.
    result = mutate(
        pod,
        policy,
        view.namespace(ns_name),
        progress,
        namespace_name=ns_name,
        copy_pod=False,
        runtime_image=runtime_image,
        push_ca=push_ca,
    )
    if result.injected:
        result.warnings[:0] = warnings
    return result


def make_app(
    view: ClusterView,
    *,
    metrics: Metrics | None = None,
    has_certificate: Callable[[], bool] = lambda: True,
    runtime_image: str = DEFAULT_RUNTIME_IMAGE,
    metrics_auth: MetricsAuth | None = None,
    client_auth: ClientCertAuth | None = None,
    push_ca: Callable[[], str | None] = lambda: None,
) -> web.Application:
    """The webhook's routes. With `client_auth`, /mutate answers only the API server (its client
    certificate; 401 before anything is read or looked up) and /readyz waits for the client CA.
    `push_ca` says the progress push CA in force now (webhook/push_ca.py; None: the ConfigMap)."""
    m = metrics or Metrics()
    app = web.Application(client_max_size=MAX_BODY_BYTES)

    async def mutate_handler(request: web.Request) -> web.Response:
        start = time.perf_counter()
        result_label = "error"
        try:
            if client_auth is not None and (why := client_auth.check(request)) is not None:
                result_label = "unauthorized"  # before the body is read or anything looked up
                return client_auth.refusal(request, why)
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                result_label = "too_large"
                return web.json_response(
                    {"error": f"request body over {MAX_BODY_BYTES} bytes"}, status=413
                )
            try:
                req = parse_review(body)
            except BadReview as e:
                result_label = "bad_request"
                return web.json_response({"error": str(e)}, status=400)
            uid = req["uid"]
            if not is_pod_create(req):
                result_label = "not_a_pod"
                return web.json_response(review_response(uid))
            try:
                result = decide(view, req, runtime_image, push_ca())
            except Exception:
                log.exception("mutation failed for %s; pod allowed unchanged", uid)
                m.errors.inc()
                return web.json_response(
                    review_response(uid, warnings=["kubeckpt: internal error, pod not injected"])
                )
            if result.injected:
                result_label = "injected"
                m.patches.inc()
            else:
                result_label = "skipped"
            for f in result.skipped:
                m.skipped.labels(f.split("/", 1)[0]).inc()
            log.debug("%s: %s", uid, result.reason)
            return web.json_response(review_response(uid, result.patch, result.warnings))
        finally:
            m.requests.labels(result_label).inc()
            m.latency.observe(time.perf_counter() - start)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if not view.synced():
            return web.Response(status=503, text="caches not synced")
        if not has_certificate():
            return web.Response(status=503, text="no serving certificate")
        if client_auth is not None and client_auth.tls.client_ca is None:
            return web.Response(status=503, text="no client CA")
        return web.Response(text="ok")

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(m.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app.router.add_post("/mutate", mutate_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    # Per-job loss and the request mix: only for callers the API server allows (metrics_auth).
    app.router.add_get(
        "/metrics", metrics_auth.protect(metrics_handler) if metrics_auth else metrics_handler
    )
    return app


async def serve(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, backlog=1024)
    await site.start()
    return runner
