"""`kubeckpt checkpoints JOB`: every checkpoint of the job, listed inside its rank-0 pod.

Only the pod sees its storage (a PVC, the ramdisk tier, an object store with the pod's own
credentials), so the listing runs there: `python3 -m trainer_runtime.listing` (then `python`),
argv only, over pods/exec, reading CHECKPOINT_URI / CHECKPOINT_LOCAL_DIR from the container's
env. It bounds itself (entries and bytes); this side bounds it again (time and bytes kept), so
a hung or hostile pod cannot hold or flood the terminal. Each way it can fail is one line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, TextIO

from kubeckpt_api import __version__
from kubeckpt_api.jobkinds import job_kind
from kubeckpt_api.optin import STATUS_ANNOTATION
from reconciler.errors import NotFound
from reconciler.exec import ExecError, ExecResult, ExecTimeout, exec_command, executable_not_found

from .cluster import Cluster
from .errors import EXIT_NOT_FOUND, CliError
from .output import dump, table
from .view import age, checkpoint_name, clean, human_bytes, now_utc, parse_time

MODULE = "trainer_runtime.listing"
PYTHONS = ("python3", "python")
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_ENTRIES = 200
DEFAULT_MAX_BYTES = 256 * 1024
SLACK_BYTES = 4096  # a trailing newline, and an older listing's slightly different bound


def _first_line(data: bytes, limit: int = 200) -> str:
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return clean(lines[-1] if lines else "no output", limit)


def container_of(pod: dict[str, Any], kind: str | None) -> str | None:
    """The container the webhook injected (its status annotation says), else the kind's."""
    meta = pod.get("metadata") or {}
    try:
        injected = json.loads((meta.get("annotations") or {}).get(STATUS_ANNOTATION, ""))
        name = injected.get("container") if isinstance(injected, dict) else None
    except ValueError:
        name = None
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    if name in names:
        return name
    jk = job_kind(kind or "")
    if jk is not None and jk.target_container in names:
        return jk.target_container
    return names[0] if names else None


def _running(pod: dict[str, Any], container: str | None) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == container:
            return "running" in (cs.get("state") or {})
    return True  # no status for it yet: let the exec say


async def find_pod(cluster: Cluster, tp: dict[str, Any]) -> dict[str, Any]:
    """The pod to list through: the one the status names, else a running rank-0 pod."""
    ns = tp["metadata"]["namespace"]
    job = tp["metadata"]["name"]
    status = tp.get("status") or {}
    latest = (status.get("checkpointing") or {}).get("latestCheckpoint")
    hint = f"; the latest checkpoint recorded is {clean(latest)}" if latest else ""
    named = status.get("observedPod")
    pod = await cluster.get_pod(named, ns) if named else None
    if pod is None:
        kind = job_kind(str(((tp.get("spec") or {}).get("jobRef") or {}).get("kind", "")))
        pods = await cluster.job_pods(tp) if kind else []
        rank0 = [p for p in pods if kind and kind.is_rank0(p["metadata"].get("labels") or {})]
        rank0.sort(key=lambda p: (p.get("status") or {}).get("phase") != "Running")
        pod = rank0[0] if rank0 else None
    if pod is None:
        gone = f"its pod {clean(named)} is gone" if named else "it has no rank-0 pod"
        raise CliError(
            f'cannot list the checkpoints of "{job}": {gone}, and they are listed through the '
            f"running rank-0 pod{hint}",
            EXIT_NOT_FOUND,
        )
    return pod


async def run_listing(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str | None,
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - bounds both tries together
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, Any]:
    """Run the listing in the pod and return its document; CliError for every failure."""
    where = f"pod {clean(pod)}" + (f" (container {clean(container)})" if container else "")
    args = ["-m", MODULE, "--max-entries", str(max_entries), "--max-bytes", str(max_bytes)]
    too_slow = CliError(
        f"listing the checkpoints in {where} took over {timeout:g}s (slow storage?): "
        "retry with a longer --timeout"
    )
    result: ExecResult | None = None
    err: BaseException | None = None
    try:
        async with asyncio.timeout(timeout):
            for python in PYTHONS:
                # exec errors are handled here; api_call turns the rest (403, 5xx) into one line
                with cluster.call("create", "pods/exec", namespace):
                    try:
                        result, err = (
                            await exec_command(
                                cluster.client,
                                namespace,
                                pod,
                                [python, *args],
                                container=container,
                                timeout=timeout,
                                max_bytes=max_bytes + SLACK_BYTES,
                            ),
                            None,
                        )
                    except NotFound:
                        raise CliError(f"{where} is gone", EXIT_NOT_FOUND) from None
                    except ExecTimeout:
                        raise too_slow from None
                    except ExecError as e:
                        result, err = None, e
                if not executable_not_found(err, result):
                    break
                result = None
    except TimeoutError:
        raise too_slow from None
    if result is None:
        if err is not None and not executable_not_found(err, None):
            raise CliError(f"cannot run the listing in {where}: {clean(str(err))}")
        raise CliError(
            f"{where} has no python3 or python: checkpoints are listed by the kubeckpt runtime "
            f"(`python -m {MODULE}`) in the training container"
        )
    if result.exit_code != 0:
        text = result.stderr.decode("utf-8", "replace")
        if "No module named" in text:
            raise CliError(
                f"the image of {where} has no {MODULE}: install kubeckpt's runtime in it "
                f"(`pip install kubeckpt`, {__version__} or later) or enable zero-code "
                "instrumentation"
            )
        raise CliError(
            f"the listing in {where} failed (exit {result.exit_code}): {_first_line(result.stderr)}"
        )
    if result.stdout_truncated:
        raise CliError(f"the listing from {where} is over {max_bytes} bytes: not shown")
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("checkpoints"), list):
        raise CliError(f"the listing from {where} is not what {MODULE} prints: not shown")
    return doc


def relative_name(c: dict[str, Any]) -> str:
    """A listed checkpoint as the runtime names it relative to CHECKPOINT_URI:
    `checkpoint-<step>`, or `generation-<N>/checkpoint-<step>` in a later generation (a job
    re-created with resume "false" writes one beside the earlier run's checkpoints). A local-tier
    copy is its name alone: the ramdisk has no generation directories."""
    name = str(c.get("name") or checkpoint_name(str(c.get("location", ""))) or "-")
    generation = c.get("generation")
    if c.get("tier") == "local" or not isinstance(generation, int) or generation <= 0:
        return name
    return f"generation-{generation}/{name}"


def add_reasons(doc: dict[str, Any], tp: dict[str, Any]) -> None:
    """Why each checkpoint exists. The manifest says it (`reason`, written by the runtime since
    it had the key); for one without, the TrainingProgress says it of the latest checkpoint. The
    checkpoint the run resumed from is marked as such (status.resumedFrom: its location, or its
    name relative to CHECKPOINT_URI, which is what the runtime reports)."""
    status = tp.get("status") or {}
    ck = status.get("checkpointing") or {}
    latest, reason = ck.get("latestCheckpoint"), ck.get("latestCheckpointReason")
    resumed = status.get("resumedFrom")
    for c in doc["checkpoints"]:
        if not isinstance(c, dict):
            continue
        if not c.get("reason") and latest and reason and c.get("location") == latest:
            c["reason"] = reason
        if resumed and resumed in (c.get("location"), relative_name(c)):
            c["resumedFrom"] = True


CHECKPOINT_HEADERS = (
    "TIER",
    "CHECKPOINT",
    "STEP",
    "STATE",
    "REASON",
    "SAVED",
    "AGE",
    "SIZE",
    "FILES",
)


def _reason(c: dict[str, Any]) -> str:
    reason = str(c.get("reason") or "-")
    return f"{reason},resumed-from" if c.get("resumedFrom") else reason


def checkpoint_rows(doc: dict[str, Any]) -> list[list[str]]:
    now = now_utc()
    rows = []
    for c in doc["checkpoints"]:
        if not isinstance(c, dict):
            continue
        when = parse_time(c.get("time"))
        size = c.get("bytes") if isinstance(c.get("bytes"), int) else None
        rows.append(
            [
                str(c.get("tier", "-")),
                relative_name(c),
                str(c.get("step", "-")),
                str(c.get("state", "-")),
                clean(_reason(c), 40),
                str(c.get("time") or "-"),
                age(when, now),
                human_bytes(size) + ("+" if c.get("sizeIsPartial") else ""),
                str(c.get("files", "-") if c.get("files") is not None else "-"),
            ]
        )
    return rows


def checkpoint_notes(doc: dict[str, Any]) -> list[str]:
    notes = []
    for c in doc["checkpoints"]:
        if isinstance(c, dict):
            for p in c.get("problems") or []:
                notes.append(f"{relative_name(c)} ({c.get('tier')}): {p}")
    for t in doc.get("tiers") or []:
        if isinstance(t, dict) and t.get("error"):
            notes.append(f"{t.get('tier')} tier {t.get('root')}: {t['error']}")
    if doc.get("truncated"):
        shown = len(doc["checkpoints"])
        notes.append(f"showing the newest {shown} of {doc.get('total', '?')} checkpoints")
    return [clean(n, 400) for n in notes]


async def checkpoints(
    cluster: Cluster,
    namespace: str,
    job: str,
    fmt: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - passed on
    out: TextIO = sys.stdout,
    kind: str | None = None,
) -> int:
    tp = await cluster.find_progress(job, namespace, kind)
    pod = await find_pod(cluster, tp)
    kind = ((tp.get("spec") or {}).get("jobRef") or {}).get("kind")
    container = container_of(pod, kind)
    name = pod["metadata"]["name"]
    if not _running(pod, container):
        phase = (pod.get("status") or {}).get("phase", "not running")
        latest = ((tp.get("status") or {}).get("checkpointing") or {}).get("latestCheckpoint")
        hint = f"; the latest checkpoint recorded is {clean(latest)}" if latest else ""
        raise CliError(
            f"pod {clean(name)} is {clean(phase)}, not running: checkpoints are listed through "
            f"the running rank-0 pod{hint}"
        )
    doc = await run_listing(cluster, namespace, name, container, timeout=timeout)
    add_reasons(doc, tp)
    if fmt == "table":
        rows = checkpoint_rows(doc)
        if rows:
            print(table(CHECKPOINT_HEADERS, rows), file=out)
        else:
            print(f"No checkpoints yet (listed in pod {clean(name)}).", file=out)
        for note in checkpoint_notes(doc):
            print(note, file=out)
    else:
        doc = dict(doc, job=job, namespace=namespace, pod=name, container=container)
        print(dump(doc, fmt), file=out)
    return 0
