"""Why Kueue suspended a job, from its Workload's status. Pure: the controller looks the Workload
up in the shared cache (workloads.py) and hands the Eviction to decide, which says it in the
TrainingProgress (Progressing=False, reason Suspended) and in one Evicted Event per eviction.

What Kueue v0.17 writes (pkg/workload/workload.go, pkg/scheduler/preemption/preemption.go):
an eviction sets the Workload condition `Evicted`=True with a reason (`Preempted`,
`PodsReadyTimeout`, `AdmissionCheck`, `ClusterQueueStopped`, `Deactivated`, ...); a preemption
adds `Preempted`=True whose reason says where (`InClusterQueue`, `InCohortReclamation`,
`InCohortFairSharing`, `InCohortReclaimWhileBorrowing`), both with the message
"Preempted to accommodate a workload (UID: <uid>, JobUID: <job uid>) due to ...". Both stay True
while the job waits and turn False (reason QuotaReserved, "Previously: ...") on readmission.

The Workload is written by Kueue, but what is taken from it is bounded and checked anyway: a
reason that is not a condition reason, a UID that is not one, a message of any length or with
control characters never reach the status as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubeckpt_api.status_model import printable
from trainer_runtime.contract.progress import format_rfc3339, parse_rfc3339

from .workload_boost import workload_job

EVICTED: Final = "Evicted"
PREEMPTED: Final = "Preempted"
EVICTION_CONDITIONS: Final = (EVICTED, PREEMPTED)
# Kueue's reasons are short CamelCase words; the API's pattern for a condition reason, shorter.
_REASON = re.compile(r"[A-Za-z](?:[A-Za-z0-9_,:]{0,62}[A-Za-z0-9_])?")
# preemptionMessage in pkg/scheduler/preemption: "UNKNOWN" when Kueue did not know one.
_PREEMPTOR = re.compile(r"\(UID: ([0-9A-Za-z-]{1,64}), JobUID: ([0-9A-Za-z._-]{1,63})\)")
# How much of Kueue's own message a non-preemption eviction quotes.
MAX_QUOTED = 200
# The longest name we print for the preemptor's job or Workload (a DNS subdomain).
MAX_NAME = 253
# How long a message the Workload cache keeps per condition (the UIDs are at its start).
MAX_CACHED_MESSAGE = 1024


@dataclass(frozen=True)
class Eviction:
    """A Workload's current eviction by Kueue."""

    reason: str  # the Evicted condition's reason: Preempted, PodsReadyTimeout, ...
    since: str | None = None  # its lastTransitionTime (RFC 3339), what tells two evictions apart
    preemption: str | None = None  # the Preempted condition's reason: InClusterQueue, ...
    preemptor_uid: str | None = None  # the preempting Workload's UID
    preemptor_job_uid: str | None = None  # and its job's
    quoted: str = ""  # Kueue's message, bounded, for an eviction that is not a preemption

    @property
    def key(self) -> str:
        """What the status's message starts with, the same on every poll of this eviction: the
        Evicted Event is sent when the stored status does not have it yet."""
        return f"evicted by Kueue at {self.since}" if self.since else "evicted by Kueue"

    def describe(self, preemptor: str | None = None) -> str:
        """The eviction in words, `preemptor` the preempting job as `describe_preemptor` names
        it; bounded (every part is)."""
        why = self.reason if self.preemption is None else f"{self.reason}: {self.preemption}"
        text = f"{self.key} ({why})"
        if preemptor:
            text += f" to admit {preemptor}"
        elif self.quoted:
            text += f": {self.quoted}"
        return text


def _reason(value: object) -> str | None:
    return value if isinstance(value, str) and _REASON.fullmatch(value) else None


def _conditions(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = workload.get("status")
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    out: dict[str, Mapping[str, Any]] = {}
    for c in conds if isinstance(conds, list) else []:
        if isinstance(c, Mapping) and c.get("type") in EVICTION_CONDITIONS:
            out.setdefault(str(c["type"]), c)
    return out


def _since(value: object) -> str | None:
    """The time in one form, or None: a value that is not a time is not printed."""
    try:
        return format_rfc3339(parse_rfc3339(value)) if isinstance(value, str) else None
    except ValueError:
        return None


def eviction_of(workload: Mapping[str, Any]) -> Eviction | None:
    """The Workload's eviction while it lasts (Evicted=True), else None."""
    conds = _conditions(workload)
    evicted = conds.get(EVICTED)
    if evicted is None or evicted.get("status") != "True":
        return None
    reason = _reason(evicted.get("reason")) or "Unknown"
    message = evicted.get("message")
    message = message if isinstance(message, str) else ""
    preempted = conds.get(PREEMPTED)
    preemption = None
    if preempted is not None and preempted.get("status") == "True":
        preemption = _reason(preempted.get("reason"))
        if isinstance(preempted.get("message"), str):
            message = preempted["message"]
    uid = job_uid = None
    if (m := _PREEMPTOR.search(message[:MAX_CACHED_MESSAGE])) is not None:
        uid, job_uid = (None if v == "UNKNOWN" else v for v in m.groups())
    quoted = ""
    if uid is None and job_uid is None and message:
        quoted = printable(" ".join(message.split()))
        if len(quoted) > MAX_QUOTED:
            quoted = quoted[: MAX_QUOTED - 3] + "..."
    return Eviction(
        reason=reason,
        since=_since(evicted.get("lastTransitionTime")),
        preemption=preemption,
        preemptor_uid=uid,
        preemptor_job_uid=job_uid,
        quoted=quoted,
    )


def _name(value: object) -> str:
    text = printable(value) if isinstance(value, str) else ""
    return text[:MAX_NAME]


def describe_preemptor(
    eviction: Eviction, workload_by_uid: Callable[[str], Mapping[str, Any] | None]
) -> str | None:
    """The preempting job by kind, namespace and name when its Workload is known (the cache,
    by UID), else by the UIDs Kueue gave; None when Kueue named no preemptor."""
    wl = workload_by_uid(eviction.preemptor_uid) if eviction.preemptor_uid else None
    if wl is not None:
        md = wl.get("metadata") or {}
        ns = _name(md.get("namespace"))
        job = workload_job(wl)
        if job is not None:
            return f"{job.kind.kind} {ns}/{_name(job.name)} (Workload {_name(md.get('name'))})"
        return f"Workload {ns}/{_name(md.get('name'))}"
    if eviction.preemptor_uid:
        return f"the Workload with UID {eviction.preemptor_uid}"
    if eviction.preemptor_job_uid:
        return f"the job with UID {eviction.preemptor_job_uid}"
    return None


def trim_conditions(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The eviction conditions as the cache keeps them: the fields read here, the message
    bounded (Kueue's may be up to 32 KiB; the preemptor's UIDs are at its start)."""
    out = []
    for c in _conditions(workload).values():
        kept = {k: c[k] for k in ("type", "status", "reason", "lastTransitionTime") if k in c}
        if isinstance(c.get("message"), str):
            kept["message"] = c["message"][:MAX_CACHED_MESSAGE]
        out.append(kept)
    return out
