"""`kubeckpt describe JOB`: the progress and conditions, the job's pods with what the webhook
injected into them, and the Events, in `kubectl describe`'s layout.

The injected settings are read back from the pods themselves (the env vars of DESIGN.md in the
target container, the `kubeckpt.io/*` label and annotations, the preStop hook, the grace
period, the `kubeckpt-*` volumes), because that is what the training process really got; the
policy may have changed since. Values from Secrets are shown by reference only.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any, TextIO

from kubeckpt_api.jobkinds import job_kind
from kubeckpt_api.optin import ANNOTATION_PREFIX, INJECTED_LABEL, STATUS_ANNOTATION
from kubeckpt_api.status_bounds import lost_seconds
from trainer_runtime.contract.env import ALL_ENV_VARS

from .checkpoints import container_of
from .cluster import Cluster
from .output import dump, table
from .view import JobView, age, clean, job_view, now_utc, parse_time

EXTRA_ENV = ("PYTHONPATH", "KUBECKPT_USER_PYTHONPATH", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
EXTRA_ENV_PREFIXES = ("AWS_",)


def env_value(var: dict[str, Any]) -> str:
    """An env var's value as the pod spec holds it; references are named, never resolved."""
    if "value" in var:
        return str(var["value"])
    source = var.get("valueFrom") or {}
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return f"<secret {ref.get('name')} key {ref.get('key')}>"
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        return f"<configmap {ref.get('name')} key {ref.get('key')}>"
    if "fieldRef" in source:
        return f"<field {source['fieldRef'].get('fieldPath')}>"
    if "resourceFieldRef" in source:
        return f"<resource {source['resourceFieldRef'].get('resource')}>"
    return "<unset>"


def injected_settings(pod: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """What kubeckpt put into (or found in) one pod, as a plain document."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    container_name = container_of(pod, kind)
    container = next(
        (c for c in spec.get("containers") or [] if c.get("name") == container_name), {}
    )
    wanted = set(ALL_ENV_VARS) | set(EXTRA_ENV)
    env = {
        str(v.get("name")): env_value(v)
        for v in container.get("env") or []
        if v.get("name") in wanted or str(v.get("name", "")).startswith(EXTRA_ENV_PREFIXES)
    }
    status: Any = annotations.get(STATUS_ANNOTATION)
    if status is not None:
        try:
            status = json.loads(status)
        except ValueError:
            pass
    prestop = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
    return {
        "pod": meta.get("name"),
        "container": container_name,
        "injected": (meta.get("labels") or {}).get(INJECTED_LABEL) == "true",
        "status": status,
        "annotations": {
            k: v
            for k, v in sorted(annotations.items())
            if k.startswith(ANNOTATION_PREFIX) and k != STATUS_ANNOTATION
        },
        "env": env,
        "preStop": prestop.get("command"),
        "terminationGracePeriodSeconds": spec.get("terminationGracePeriodSeconds"),
        "volumes": [
            v.get("name")
            for v in spec.get("volumes") or []
            if str(v.get("name", "")).startswith("kubeckpt-")
        ],
    }


def _pod_row(pod: dict[str, Any], kind: str | None, now: datetime) -> list[str]:
    meta = pod.get("metadata") or {}
    jk = job_kind(kind or "")
    rank0 = jk is not None and jk.is_rank0(meta.get("labels") or {})
    status = pod.get("status") or {}
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
    return [
        str(meta.get("name")),
        str(status.get("phase", "-")),
        "yes" if rank0 else "",
        "yes" if (meta.get("labels") or {}).get(INJECTED_LABEL) == "true" else "NO",
        str(restarts),
        str((pod.get("spec") or {}).get("nodeName") or "-"),
        age(parse_time(meta.get("creationTimestamp")), now),
    ]


def _progress_lines(v: JobView, status: dict[str, Any], now: datetime) -> list[str]:
    ck = status.get("checkpointing") or {}
    lines = [f"State:         {v.state}"]
    parts = [f"step {v.step_text()}", v.percent_text()]
    if v.epoch is not None:
        parts.append(f"epoch {v.epoch}" + (f"/{v.total_epochs}" if v.total_epochs else ""))
    if v.loss:
        parts.append(f"loss {v.loss}")
    if status.get("learningRate"):
        parts.append(f"lr {status['learningRate']}")
    if v.eta:
        parts.append(f"ETA {v.eta}")
    if v.step_seconds:
        parts.append(f"{v.step_seconds} s/step")
    lines.append("Progress:      " + ", ".join(parts))
    if v.last_update:
        source = status.get("source", "?")
        lines.append(
            f"Updated:       {age(v.last_update, now)} ago, from pod "
            f"{v.observed_pod or '-'} ({source})"
        )
    if status.get("resumedFrom"):
        lines.append(f"Resumed from:  {status['resumedFrom']}")
    lines += _lifetime_lines(v, status)
    if ck:
        lines.append("Checkpointing:")
        lines.append(f"  Enabled:     {ck.get('enabled', '-')}")
        if v.latest_checkpoint:
            why = f", {v.latest_checkpoint_reason}" if v.latest_checkpoint_reason else ""
            when = age(v.latest_checkpoint_time, now)
            lines.append(f"  Latest:      {v.latest_checkpoint} ({when} ago{why})")
        if ck.get("latestLocalCheckpoint"):
            lines.append(f"  Local:       {ck['latestLocalCheckpoint']}")
        counts = [f"{v.checkpoints_created or 0} over the job's life"]
        life = status.get("lifetime")
        if isinstance(life, dict) and isinstance(life.get("incarnationCheckpoints"), int):
            counts.append(f"{life['incarnationCheckpoints']} by this process")
        if ck.get("localCheckpointsCreated"):
            counts.append(f"{ck['localCheckpointsCreated']} local")
        lines.append(f"  Created:     {', '.join(counts)}")
        if ck.get("lastSaveSeconds"):
            stall = ck.get("lastStallSeconds")
            lines.append(
                f"  Last save:   {ck['lastSaveSeconds']} s"
                + (f" (training blocked {stall} s)" if stall else "")
            )
        if ck.get("failedSaves"):
            lines.append(
                f"  Failed:      {ck['failedSaves']} (last at step "
                f"{ck.get('lastFailedStep', '?')}: {ck.get('lastError', '?')})"
            )
    return lines


def _lifetime_lines(v: JobView, status: dict[str, Any]) -> list[str]:
    """Interruptions and what they cost, over the job's life and the last one."""
    if not v.interruptions:
        return []
    resumed = f" ({v.resumes} resumed from a checkpoint)" if v.resumes is not None else ""
    lines = [f"Interruptions: {v.interruptions}{resumed}"]
    lost = f"{v.steps_lost or 0} steps, {_seconds(v.seconds_lost)}"
    last = (status.get("lifetime") or {}).get("lastInterruption")
    if isinstance(last, dict):
        steps = last.get("stepsLost")
        seconds = lost_seconds(last.get("secondsLost"))
        lost += f" (last: {steps if isinstance(steps, int) else '?'} steps, {_seconds(seconds)}"
        if isinstance(when := last.get("time"), str):
            lost += f" at {clean(when, 40)}"
        lost += ")"
    lines.append(f"Lost:          {lost}")
    return lines


def _seconds(value: float | None) -> str:
    return "? s" if value is None else f"{value:.0f} s"


def _event_row(e: dict[str, Any], now: datetime) -> list[str]:
    when = parse_time(
        e.get("lastTimestamp")
        or e.get("eventTime")
        or (e.get("metadata") or {}).get("creationTimestamp")
    )
    count = int(e.get("count") or 1)
    obj = e.get("involvedObject") or {}
    return [
        age(when, now) + (f" (x{count})" if count > 1 else ""),
        str(e.get("type", "")),
        str(e.get("reason", "")),
        f"{obj.get('kind', '')}/{obj.get('name', '')}",
        str(e.get("message", "")),
    ]


def _indent(text: str, by: str = "  ") -> list[str]:
    return [by + line for line in text.splitlines()]


async def describe(
    cluster: Cluster,
    namespace: str,
    job: str,
    fmt: str,
    out: TextIO = sys.stdout,
    *,
    kind: str | None = None,
) -> int:
    tp = await cluster.find_progress(job, namespace, kind)
    ref = (tp.get("spec") or {}).get("jobRef") or {}
    kind = ref.get("kind")
    job_obj = await cluster.job(tp)
    pods = await cluster.job_pods(tp)
    events = await cluster.events(tp)
    now = now_utc()
    v = job_view(tp)
    status = tp.get("status") or {}
    # The rank-0 pod the progress comes from, else the first: its injected settings are shown.
    shown = next((p for p in pods if p["metadata"]["name"] == v.observed_pod), None)
    shown = shown or (pods[0] if pods else None)
    settings = [injected_settings(p, kind) for p in pods]
    if fmt != "table":
        doc = {
            "namespace": namespace,
            "name": job,
            "jobRef": ref,
            "jobExists": job_obj is not None,
            "status": v.to_dict(now),
            "pods": settings,
            "events": [
                {k: e.get(k) for k in ("type", "reason", "message", "count", "lastTimestamp")}
                | {"object": e.get("involvedObject", {}).get("kind")}
                for e in events
            ],
        }
        print(dump(doc, fmt), file=out)
        return 0

    lines = [
        f"Name:          {job}",
        f"Namespace:     {namespace}",
        f"Job:           {kind or '?'} {ref.get('name', '?')} ({ref.get('apiVersion', '?')})"
        + ("" if job_obj is not None else "  [not found: deleted, or its CRD is missing]"),
    ]
    lines += _progress_lines(v, status, now)
    lines.append("Conditions:")
    if v.conditions:
        rows = [
            [
                str(c.get("type", "")),
                str(c.get("status", "")),
                str(c.get("reason", "")),
                age(parse_time(c.get("lastTransitionTime")), now),
                str(c.get("message", "")),
            ]
            for c in v.conditions
        ]
        lines += _indent(table(("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"), rows))
    else:
        lines.append("  <none>")
    lines.append("Pods:")
    if pods:
        headers = ("NAME", "PHASE", "RANK0", "INJECTED", "RESTARTS", "NODE", "AGE")
        lines += _indent(table(headers, [_pod_row(p, kind, now) for p in pods]))
    else:
        lines.append("  <none>")
    if shown is not None:
        s = injected_settings(shown, kind)
        lines.append(f"Injected settings (pod {s['pod']}, container {s['container']}):")
        if not s["injected"]:
            lines.append("  not injected: the webhook did not mutate this pod (was it down?)")
        if isinstance(s["status"], dict):
            st = s["status"]
            lines.append(
                f"  Policy:      {st.get('policy', '-')} (kubeckpt {st.get('version', '?')})"
            )
            if st.get("skipped"):
                lines.append(f"  Kept user's: {', '.join(map(str, st['skipped']))}")
        elif s["status"] is not None:
            lines.append(f"  Status:      {s['status']}")
        for k, val in s["annotations"].items():
            lines.append(f"  {k}: {val}")
        if s["env"]:
            lines.append("  Env:")
            lines += [f"    {k}={val}" for k, val in s["env"].items()]
        if s["preStop"]:
            lines.append(f"  preStop:     {' '.join(map(str, s['preStop']))[:200]}")
        if s["terminationGracePeriodSeconds"] is not None:
            lines.append(f"  Grace:       {s['terminationGracePeriodSeconds']}s")
        if s["volumes"]:
            lines.append(f"  Volumes:     {', '.join(map(str, s['volumes']))}")
    lines.append("Events:")
    if events:
        rows = [_event_row(e, now) for e in events]
        lines += _indent(table(("AGE", "TYPE", "REASON", "OBJECT", "MESSAGE"), rows))
    else:
        lines.append("  <none>")
    print("\n".join(clean(line, 1000) for line in lines), file=out)
    return 0
