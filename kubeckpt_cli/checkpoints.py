"""`kubeckpt checkpoints JOB`: every checkpoint of the job, listed inside its rank-0 pod, else
in a short-lived lister pod (`lister_pod`), or from a local path (`--storage`, `local_storage`).

All three run one listing, `trainer_runtime.listing.listing`, and show it with `show`: the same
table, states and REASONs whichever way it was read.

Only a pod sees its storage (a PVC, the ramdisk tier, an object store with the pod's own
credentials), so the listing runs there: `python3 -m trainer_runtime.listing` (then `python`),
argv only, over pods/exec, reading CHECKPOINT_URI / CHECKPOINT_LOCAL_DIR from the container's
env. It bounds itself (entries and bytes); this side bounds it again (time and bytes kept), so
a hung or hostile pod cannot hold or flood the terminal. Each way it can fail is one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from kubeckpt_api import __version__
from kubeckpt_api.jobkinds import JOB_KINDS, JobKind, job_kind
from kubeckpt_api.optin import STATUS_ANNOTATION
from reconciler.errors import NotFound
from reconciler.exec import ExecError, ExecResult, ExecTimeout, exec_command, executable_not_found

from . import lister_pod as lister
from . import local_storage
from .cluster import Cluster
from .errors import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_VERIFY_FAILED, CliError
from .output import dump, table
from .view import age, checkpoint_name, clean, human_bytes, now_utc, parse_time

MODULE = "trainer_runtime.listing"
PYTHONS = ("python3", "python")
DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_ENTRIES = 200
DEFAULT_MAX_BYTES = 256 * 1024
SLACK_BYTES = 4096  # a trailing newline, and an older listing's slightly different bound
# What a user can do when the checkpoints cannot be listed through the cluster.
GONE_HINT = (
    "; for a deleted job, name its --kind (a lister pod then mounts the storage), or pass "
    "--storage PATH with the storage mounted here"
)
PASS_STORAGE = "pass --storage PATH with the storage mounted here"
STORAGE_HINT = f"; or {PASS_STORAGE}"
LISTER_HINT = (
    ": listing without a running pod creates a short-lived pod in the namespace (it needs "
    f"create, get, list and delete on pods and get on pods/log){STORAGE_HINT}"
)


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


async def find_pod(cluster: Cluster, tp: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The pod to list through: the one the status names, else a rank-0 pod (a running one
    first). None, and what to say of it, when there is none."""
    ns = tp["metadata"]["namespace"]
    job = tp["metadata"]["name"]
    named = (tp.get("status") or {}).get("observedPod")
    pod = await cluster.get_pod(named, ns) if named else None
    if pod is None:
        kind = job_kind(str(((tp.get("spec") or {}).get("jobRef") or {}).get("kind", "")))
        pods = await cluster.job_pods(tp) if kind else []
        rank0 = [p for p in pods if kind and kind.is_rank0(p["metadata"].get("labels") or {})]
        rank0.sort(key=lambda p: (p.get("status") or {}).get("phase") != "Running")
        pod = rank0[0] if rank0 else None
    if pod is None:
        gone = f"its pod {clean(named)} is gone" if named else "it has no rank-0 pod"
        return None, f'cannot list the checkpoints of "{clean(job)}": {gone}'
    return pod, ""


async def run_listing(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str | None,
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - bounds both tries together
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    verify: bool = False,
) -> dict[str, Any]:
    """Run the listing in the pod and return its document; CliError for every failure.
    `verify`: the listing also checks every checkpoint's content (`--verify`)."""
    where = f"pod {clean(pod)}" + (f" (container {clean(container)})" if container else "")
    args = ["-m", MODULE, "--max-entries", str(max_entries), "--max-bytes", str(max_bytes)]
    args += ["--verify"] if verify else []
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
        if verify and "--verify" in text:
            raise CliError(
                f"the kubeckpt runtime in {where} is older than --verify: upgrade its image "
                f"(kubeckpt {__version__}), or pass --storage PATH with the storage mounted here"
            )
        raise CliError(
            f"the listing in {where} failed (exit {result.exit_code}): {_first_line(result.stderr)}"
        )
    return parse_listing(result.stdout, result.stdout_truncated, where, max_bytes)


def parse_listing(stdout: bytes, truncated: bool, where: str, max_bytes: int) -> dict[str, Any]:
    """The document `python -m trainer_runtime.listing` printed (pods/exec or a pod's log)."""
    if truncated:
        raise CliError(f"the listing from {where} is over {max_bytes} bytes: not shown")
    try:
        doc = json.loads(stdout)
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


VERIFY_HEADERS = ("TIER", "CHECKPOINT", "STEP", "VERIFIED", "WHY")


def verify_rows(doc: dict[str, Any]) -> list[list[str]]:
    """`--verify`: per checkpoint OK, FAILED with its first problem, or "-" (not checked: being
    written, never finished, or in a tier --verify cannot read)."""
    rows = []
    for c in doc["checkpoints"]:
        if not isinstance(c, dict):
            continue
        verified = c.get("verified")
        problems = [str(p) for p in c.get("problems") or []]
        word = {True: "OK", False: "FAILED"}.get(verified, "-") if "verified" in c else "-"
        why = problems[0] if problems and verified is not True else "-"
        rows.append(
            [
                str(c.get("tier", "-")),
                relative_name(c),
                str(c.get("step", "-")),
                word,
                clean(why, 120),
            ]
        )
    return rows


def failed_verification(doc: dict[str, Any]) -> bool:
    return any(isinstance(c, dict) and c.get("verified") is False for c in doc["checkpoints"])


def show(
    doc: dict[str, Any], fmt: str, out: TextIO, where: str, *, verify: bool = False, **about: Any
) -> int:
    """The table (and its notes), or the document with what was listed where (`about`). With
    `verify`, the verification's table; the exit code: EXIT_VERIFY_FAILED when a checkpoint
    failed it."""
    code = EXIT_VERIFY_FAILED if verify and failed_verification(doc) else 0
    if fmt == "table":
        headers, rows = (
            (VERIFY_HEADERS, verify_rows(doc))
            if verify
            else (CHECKPOINT_HEADERS, checkpoint_rows(doc))
        )
        if rows:
            print(table(headers, rows), file=out)
        else:
            print(f"No checkpoints yet (listed in {where}).", file=out)
        for note in checkpoint_notes(doc):
            print(note, file=out)
    else:
        print(dump(dict(doc, **about), fmt), file=out)
    return code


def _latest_hint(tp: dict[str, Any] | None) -> str:
    latest = (((tp or {}).get("status") or {}).get("checkpointing") or {}).get("latestCheckpoint")
    return f"; the latest checkpoint recorded is {clean(latest)}" if latest else ""


async def checkpoints(
    cluster: Cluster,
    namespace: str,
    job: str,
    fmt: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - passed on
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    kind: str | None = None,
    policy: str | None = None,
    image: str | None = None,
    verify: bool = False,
) -> int:
    """List through the running rank-0 pod; without one (the job ended, or was deleted), through
    a lister pod that mounts the job's storage (`through_lister`). `verify`: check every
    checkpoint's content there too (exit EXIT_VERIFY_FAILED when one fails)."""
    try:
        tp: dict[str, Any] | None = await cluster.find_progress(job, namespace, kind)
    except CliError as e:
        if e.code != EXIT_NOT_FOUND:
            raise
        if kind is None:
            raise CliError(f"{e.message}{GONE_HINT}", e.code) from None
        tp = None  # a deleted job's TrainingProgress goes with it: --kind says what it was
    pod: dict[str, Any] | None = None
    if tp is None:
        problem, code = (
            f'cannot list the checkpoints of "{clean(job)}": it has no TrainingProgress',
            EXIT_NOT_FOUND,
        )
    else:
        kind = ((tp.get("spec") or {}).get("jobRef") or {}).get("kind")
        pod, problem = await find_pod(cluster, tp)
        code = EXIT_NOT_FOUND
        if pod is not None:
            container = container_of(pod, kind)
            name = pod["metadata"]["name"]
            if _running(pod, container):
                doc = await run_listing(
                    cluster, namespace, name, container, timeout=timeout, verify=verify
                )
                add_reasons(doc, tp)
                return show(
                    doc, fmt, out, f"pod {clean(name)}", verify=verify,
                    job=job, namespace=namespace, pod=name, container=container,
                )  # fmt: skip
            phase = (pod.get("status") or {}).get("phase", "not running")
            problem, code = f"pod {clean(name)} is {clean(phase)}, not running", EXIT_ERROR
    gone = Gone(problem, code, pod, job_kind(kind or ""), kind or "")
    doc, where, about = await through_lister(
        cluster, namespace, job, tp, gone,
        timeout=timeout, err=err, policy=policy, image=image, verify=verify,
    )  # fmt: skip
    return show(doc, fmt, out, where, verify=verify, **about)


@dataclass(frozen=True)
class Gone:
    """Why the rank-0 pod cannot list (and the exit code if nothing else can), the pod left of
    the job if any (the lister pod is placed as it was), and the job's kind."""

    problem: str
    code: int
    pod: dict[str, Any] | None
    kind: JobKind | None
    kind_name: str


async def through_lister(
    cluster: Cluster,
    namespace: str,
    job: str,
    tp: dict[str, Any] | None,
    gone: Gone,
    *,
    timeout: float,  # noqa: ASYNC109 - the pod's deadline too
    err: TextIO,
    policy: str | None,
    image: str | None,
    verify: bool = False,
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The listing from a lister pod (`lister_pod`), where it ran, and what `-o json` says of
    it."""
    if gone.kind is None:
        raise CliError(
            f"{gone.problem}, and its kind {clean(gone.kind_name)} is not served here", gone.code
        )
    latest = (((tp or {}).get("status") or {}).get("checkpointing") or {}).get("latestCheckpoint")
    try:
        policies = await lister.find_policies(cluster, namespace)
        storage = lister.choose_storage(
            policies, gone.kind, namespace, job, policy_name=policy, latest=latest
        )
    except CliError as e:
        raise CliError(
            f"{gone.problem}, and no lister pod can mount its storage: {e.message}; {PASS_STORAGE}"
            f"{_latest_hint(tp)}",
            gone.code,
        ) from None
    image = image or lister.default_image(os.environ)
    name = lister.pod_name(job)
    manifest = lister.lister_pod(
        name,
        job,
        storage,
        image,
        deadline_seconds=lister.deadline_for(timeout),
        max_entries=DEFAULT_MAX_ENTRIES,
        max_bytes=DEFAULT_MAX_BYTES,
        placement=(gone.pod or {}).get("spec"),
        verify=verify,
    )
    print(f"kubeckpt: {gone.problem}: listing through lister pod {name} ({image})", file=err)
    try:
        await lister.remove_stale(cluster, namespace)
        exit_code, log, cut, where = await lister.run_lister_pod(
            cluster, namespace, manifest, timeout=timeout, max_bytes=DEFAULT_MAX_BYTES + SLACK_BYTES
        )
    except CliError as e:
        hint = LISTER_HINT if e.message.startswith("forbidden:") else STORAGE_HINT
        raise CliError(f"{e.message}{hint}", e.code) from None
    if exit_code != 0:
        raise CliError(
            f"the listing in {where} failed (exit {exit_code}): {_first_line(log)}: is {image} "
            "an image with kubeckpt's runtime (--image)?"
        )
    doc = parse_listing(log, cut, where, DEFAULT_MAX_BYTES)
    if missing := lister.missing_packages(doc):
        raise CliError(
            f"the image of {where}, {clean(image)}, has no {missing} to read "
            f"{clean(storage.checkpoint_uri)}: pass --image with one that has them (kubeckpt's "
            "runtime image, or the job's own training image)"
        )
    if tp is not None:
        add_reasons(doc, tp)
    about = dict(
        job=job, namespace=namespace, pod=name, container=lister.CONTAINER,
        policy=storage.policy, lister=True,
    )  # fmt: skip
    return doc, where, about


async def checkpoints_in_storage(
    path: str,
    namespace: str,
    job: str,
    fmt: str,
    *,
    kind: str | None = None,
    out: TextIO = sys.stdout,
    verify: bool = False,
) -> int:
    """`--storage PATH`: the same listing, of a local path (`local_storage`); no cluster."""
    kinds = [k for k in JOB_KINDS if kind in (None, k.kind)]
    root = local_storage.job_root(path, namespace, job, kinds)
    doc = local_storage.list_local(
        root, max_entries=DEFAULT_MAX_ENTRIES, max_bytes=DEFAULT_MAX_BYTES, verify=verify
    )
    return show(
        doc, fmt, out, clean(str(root)), verify=verify,
        job=job, namespace=namespace, storage=str(root),
    )  # fmt: skip
