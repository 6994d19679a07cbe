"""The progress push endpoint: a training pod POSTs its progress instead of waiting for an exec.

The protocol is Kubeflow Trainer's status server's (pkg/statusserver, KEP 2779), which
transformers' `KubeflowCallback` speaks: `POST /apis/<group>/<version>/namespaces/<ns>/<plural>/
<name>/status` with `Authorization: Bearer <projected token>` and a JSON body (push_body.py);
200 echoes the body. The job kinds are ours (PyTorchJob `kubeflow.org/v1/pytorchjobs`, TrainJob
`trainer.kubeflow.org/v1alpha1/trainjobs`).

Every check happens before anything is written, and a refusal changes no status:

- 413 a body over `MAX_BODY_BYTES` (by Content-Length before reading, else while reading);
- 401 no token, not valid, not of our audience, expired; 429 the review budget is spent;
  503 the API server cannot be asked, or this replica is not the leader (push_auth.py);
- 404 a path that names no job kind of ours (or one whose API the cluster lacks), or a job not
  in the synced cache (503 while that cache has not synced);
- 403 the token's pod is not in the cache, has another UID (a token replayed after its pod went),
  is not injected, or is not a pod the named job owns (labels name it and ownerReferences prove
  it: ownership.py, as for pull): a pod can update only its own job;
- 400 a body a progress file would not pass (push_body.py);
- 409 the job has no TrainingProgress of its own (one of a deleted predecessor, or one not yet
  created): we do not write one we do not own.

An accepted push hands the record to the controller (`ProgressController.accept_push`), which
writes it through the same decide/apply path as an exec read, at most one write per reconcile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram

from trainer_runtime.contract.progress import MAX_PROGRESS_BYTES

from . import discovery as d
from .metrics import PUSH_SECONDS, PushCollector
from .push_auth import PodIdentity, PushAuth, Refusal
from .push_body import PushBodyError, parse_push

if TYPE_CHECKING:
    from .controller import ProgressController

log = logging.getLogger("kubeckpt.progress.push")

MAX_BODY_BYTES: Final = MAX_PROGRESS_BYTES
ROUTE: Final = "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status"
_KINDS: Final = {(k.group, k.version, k.plural): k for k in d.JOB_KINDS}


def push_path(kind: d.JobKind, namespace: str, name: str) -> str:
    """The URL path a pod of this job pushes to."""
    return f"/apis/{kind.group}/{kind.version}/namespaces/{namespace}/{kind.plural}/{name}/status"


def _error(status: int, reason: str, message: str) -> web.Response:
    """A Kubernetes `Status` object, as Trainer's server answers."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status,
    }
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="kubeckpt-progress"'}
    return web.json_response(body, status=status, headers=headers)


_REASONS: Final = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    413: "RequestEntityTooLarge",
    429: "TooManyRequests",
    503: "ServiceUnavailable",
}


def refuse(status: int, message: str) -> web.Response:
    return _error(status, _REASONS[status], message)


async def read_capped(request: web.Request, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (nothing more is read)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks, size = [], 0
    while True:
        chunk = await request.content.read(min(65536, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


class PushEndpoint:
    """The aiohttp handler; `controller` holds the caches and the write path. With `registry`
    (the manager's, served on its /metrics), its counters and latency are exported there
    (metrics.PushCollector, PUSH_SECONDS)."""

    def __init__(
        self,
        controller: ProgressController,
        auth: PushAuth,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.controller = controller
        self.auth = auth
        self.codes: Counter[int] = Counter()  # answers by HTTP status
        # Token check to answer, body read included (a slow sender makes a slow push).
        self.seconds = Histogram(
            PUSH_SECONDS, "Seconds to handle a progress push, read to answer", registry=registry
        )
        if registry is not None:
            registry.register(PushCollector(self.codes, auth.stats))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(ROUTE, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        resp = await self._handle(request)
        self.seconds.observe(time.perf_counter() - start)
        self.codes[resp.status] += 1
        if resp.status != 200:
            log.info("push %s refused: %d %s", request.path, resp.status, resp.text)
        return resp

    async def _handle(self, request: web.Request) -> web.Response:
        # The size first: nothing over the limit is read, let alone parsed, whoever sends it.
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return refuse(413, f"the body is over the limit of {MAX_BODY_BYTES} bytes")
        who = await self.auth.check(request.headers.get("Authorization", ""))
        if isinstance(who, Refusal):
            return refuse(who.status, who.reason)
        m = request.match_info
        kind = _KINDS.get((m["group"], m["version"], m["plural"]))
        if kind is None:
            return refuse(404, f"{m['group']}/{m['version']} {m['plural']} is not a job kind")
        ns, name = m["namespace"], m["name"]
        data = await read_capped(request, MAX_BODY_BYTES)
        if data is None:
            return refuse(413, f"the body is over the limit of {MAX_BODY_BYTES} bytes")
        ctl = self.controller
        if not ctl.manager.is_leader:
            return refuse(503, "this replica is not the leader: retry (the Service picks again)")
        key = d.job_key(kind, ns, name)
        job, _ = ctl.job(key)
        if job is None:
            ready = ctl.job_cache_ready(kind)
            if ready is None:  # e.g. TrainJobs on a cluster without Trainer's API
                return refuse(404, f"{kind.kind}s are not served here (their API is not found)")
            if not ready:  # not "not found": the job may well exist
                return refuse(503, f"the {kind.kind} cache is not synced yet: retry")
            return refuse(404, f"{kind.kind} {ns}/{name} not found")
        pod = await self._bound_pod(who, kind, ns, name, key, job)
        if isinstance(pod, web.Response):
            return pod
        try:
            record = parse_push(data)
        except PushBodyError as e:
            return refuse(400, f"invalid progress: {e}")
        tp, _ = ctl._progress(key, job, kind)
        if tp is None:
            return refuse(
                409,
                f"{kind.kind} {ns}/{name} has no TrainingProgress that it owns (a deleted job's "
                "is still there, or none is made yet): kubeckpt does not write one it does not own",
            )
        if record is not None:
            ctl.accept_push(key, who.pod_uid, record)
        try:
            echo: Any = json.loads(data)
        except ValueError:  # parse_push accepted it
            echo = {}
        return web.json_response(echo)

    async def _bound_pod(
        self, who: PodIdentity, kind: d.JobKind, ns: str, name: str, key: str, job: Any
    ) -> dict[str, Any] | web.Response:
        """The token's pod, if it is one the named job owns; else the 403 that says why."""
        if who.namespace != ns:
            return refuse(403, f"the token is for a pod in namespace {who.namespace}, not {ns}")
        ctl = self.controller
        pod = ctl.pods.store.get(f"{ns}/{who.pod_name}")
        if pod is None:
            return refuse(403, f"pod {ns}/{who.pod_name} (the token's) is not an injected pod")
        if (pod.get("metadata") or {}).get("uid") != who.pod_uid:
            return refuse(
                403, f"pod {ns}/{who.pod_name} is not the pod the token was issued for (replaced)"
            )
        if not d.injected(pod):
            return refuse(403, f"pod {ns}/{who.pod_name} is not injected by kubeckpt")
        if d.pod_job_key(pod) != key:
            return refuse(403, f"pod {ns}/{who.pod_name} does not belong to {kind.kind} {name}")
        own, foreign = await ctl.owners.split([pod], job, kind)
        if not own:
            why = next(iter(foreign.values()), "not owned")
            return refuse(403, f"pod {ns}/{who.pod_name} is not {kind.kind} {name}'s: {why}")
        return pod


async def serve_push(endpoint: PushEndpoint, host: str, port: int, cert_dir: str | None) -> None:
    """Serve the endpoint over HTTPS until cancelled. `cert_dir`: tls.crt/tls.key (a Secret's
    mount, reloaded when it changes, as the webhook's); none: a self-signed certificate, which
    pods cannot verify (for tests and development)."""
    from reconciler.admission import FileCertSource, ServingTLS
    from reconciler.metrics_auth import server_tls

    tasks: list[asyncio.Task[None]] = []
    if cert_dir:
        tls = ServingTLS()
        source = FileCertSource(cert_dir, tls)
        tasks.append(asyncio.create_task(source.run(), name="progress-push-certificate"))
        await tls.wait_ready()
        ctx = tls.context
    else:
        ctx = server_tls(None, hosts=("localhost",))
    runner = web.AppRunner(endpoint.app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=ctx, backlog=1024).start()
        log.info("progress push endpoint on %s:%d", host, port)
        await asyncio.Event().wait()
    finally:
        for t in tasks:
            t.cancel()
        await runner.cleanup()
        await endpoint.auth.close()
