"""What the CLI shows of a TrainingProgress: one `JobView` per job, pure and clock-injected, so the
table, the JSON and the live view say the same thing and tests can pin the time.

State is `status.state` when the controller wrote it, else derived from the conditions with the
controller's own rule (`state_of`), so an object written by an older controller reads the same.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubeckpt_api.status import STATES, state_of
from kubeckpt_api.status_bounds import lost_seconds
from trainer_runtime.contract.progress import parse_rfc3339


def clean(text: object, limit: int = 200) -> str:
    """`text` safe for a terminal: control characters (escape sequences, newlines) and lone
    surrogates become `?`, and it is cut at `limit`. Everything shown from the cluster or a pod
    passes through here: names and messages are whatever their writers put there."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") and ch != " ":
            out.append("?")
        else:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None


def age(then: datetime | None, now: datetime) -> str:
    """kubectl's short form: 45s, 12m, 3h, 2d (and `-` when unknown)."""
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # unreachable


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    try:
        f = float(str(value))
    except ValueError:
        return None
    return f if f == f and abs(f) != float("inf") else None


def checkpoint_name(location: str | None) -> str | None:
    """`checkpoint-150` from `/mnt/kubeckpt/ns/job/checkpoint-150` (or an s3:// URI), and
    `generation-2/checkpoint-150` for a later generation's: the two runs' checkpoints of one
    step are different checkpoints."""
    if not location:
        return None
    parts = location.rstrip("/").rsplit("/", 2)
    name = parts[-1]
    if len(parts) == 3 and parts[-2].startswith("generation-") and parts[-2][11:].isdigit():
        return f"{parts[-2]}/{name}"
    return name or None


@dataclass
class JobView:
    namespace: str
    name: str
    kind: str
    state: str
    step: int | None
    total_steps: int | None
    percent: float | None
    loss: str | None
    eta: str | None
    epoch: int | None = None
    total_epochs: int | None = None
    step_seconds: str | None = None
    latest_checkpoint: str | None = None
    latest_checkpoint_time: datetime | None = None
    latest_checkpoint_reason: str | None = None
    checkpoints_created: int | None = None  # over the job's life (status.lifetime)
    interruptions: int | None = None
    resumes: int | None = None
    steps_lost: int | None = None
    seconds_lost: float | None = None
    observed_pod: str | None = None
    last_update: datetime | None = None
    created: datetime | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fraction(self) -> float | None:
        """Done, 0..1: percentComplete, else step/totalSteps."""
        if self.percent is not None:
            return min(1.0, max(0.0, self.percent / 100))
        if self.step is not None and self.total_steps:
            return min(1.0, max(0.0, self.step / self.total_steps))
        return None

    def step_text(self) -> str:
        if self.step is None:
            return "-"
        return f"{self.step}/{self.total_steps}" if self.total_steps else str(self.step)

    def percent_text(self) -> str:
        f = self.fraction
        return "-" if f is None else f"{f * 100:.1f}%"

    def checkpoint_text(self) -> str:
        return clean(checkpoint_name(self.latest_checkpoint) or "-", 60)

    def to_dict(self, now: datetime) -> dict[str, Any]:
        """The JSON/YAML form (camelCase, as the API's own fields)."""
        ck_age = (
            int((now - self.latest_checkpoint_time).total_seconds())
            if self.latest_checkpoint_time
            else None
        )
        return {
            "namespace": self.namespace,
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "step": self.step,
            "totalSteps": self.total_steps,
            "percentComplete": None if self.fraction is None else round(self.fraction * 100, 2),
            "epoch": self.epoch,
            "totalEpochs": self.total_epochs,
            "loss": self.loss,
            "estimatedTimeRemaining": self.eta,
            "stepSeconds": self.step_seconds,
            "latestCheckpoint": self.latest_checkpoint,
            "latestCheckpointTime": _fmt(self.latest_checkpoint_time),
            "latestCheckpointAgeSeconds": ck_age,
            "latestCheckpointReason": self.latest_checkpoint_reason,
            "checkpointsCreated": self.checkpoints_created,
            "interruptions": self.interruptions,
            "resumes": self.resumes,
            "stepsLost": self.steps_lost,
            "secondsLost": self.seconds_lost,
            "observedPod": self.observed_pod,
            "lastUpdateTime": _fmt(self.last_update),
            "conditions": self.conditions,
        }


def _fmt(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


def job_view(tp: dict[str, Any]) -> JobView:
    """The view of one TrainingProgress object (any shape: fields may be missing or odd)."""
    meta = tp.get("metadata") or {}
    spec = tp.get("spec") or {}
    status = tp.get("status") or {}
    ck = status.get("checkpointing") or {}
    life = status.get("lifetime") or {}
    life = life if isinstance(life, dict) else {}
    job_ref = spec.get("jobRef") or {}
    state = status.get("state")
    if state not in STATES:
        state = state_of(status)
    loss = status.get("loss")
    eta = status.get("estimatedTimeRemaining")
    return JobView(
        namespace=str(meta.get("namespace", "")),
        # The job's name: its TrainingProgress is named otherwise when a job of another kind
        # holds that name (`llama-trainjob`); KIND tells the two apart.
        name=str(job_ref.get("name") or meta.get("name", "")),
        kind=str(job_ref.get("kind") or "-"),
        state=state,
        step=_int(status.get("step")),
        total_steps=_int(status.get("totalSteps")),
        percent=_float(status.get("percentComplete")),
        loss=str(loss) if loss is not None else None,
        eta=str(eta) if eta else None,
        epoch=_int(status.get("epoch")),
        total_epochs=_int(status.get("totalEpochs")),
        step_seconds=str(status["stepSeconds"]) if status.get("stepSeconds") else None,
        latest_checkpoint=ck.get("latestCheckpoint") or None,
        latest_checkpoint_time=parse_time(ck.get("latestCheckpointTime")),
        latest_checkpoint_reason=ck.get("latestCheckpointReason") or None,
        checkpoints_created=_int(ck.get("checkpointsCreated")),
        interruptions=_int(life.get("interruptions")),
        resumes=_int(life.get("resumes")),
        steps_lost=_int(life.get("stepsLost")),
        seconds_lost=lost_seconds(life.get("secondsLost")),
        observed_pod=status.get("observedPod") or None,
        last_update=parse_time(status.get("lastUpdateTime")),
        created=parse_time(meta.get("creationTimestamp")),
        conditions=list(status.get("conditions") or []),
    )


def now_utc() -> datetime:
    return datetime.now(UTC)
