"""What kubeckpt publishes on a job's pods for checkpoint-aware preemption (stdlib only).

An extension of DESIGN.md's contract, which lists in "Pods" what the webhook sets at admission:
the progress controller later sets these two annotations on every pod of a job, so that a
scheduler or an admin can tell which job loses least when preempted by looking at pods alone
(Kueue issue #477), without reading TrainingProgress objects. The TrainingProgress carries the
same in `status.checkpointing` (`latestCheckpointTime`, and the step in `latestCheckpoint`'s
`checkpoint-<step>` name).

Values are always in one form, whatever the progress file held, so that a reader can compare
them as they are: the time in UTC to the second ("2024-01-15T10:25:00Z", which also sorts as a
string), the step as a decimal int64 ("150"). A part that is not known is absent, never stale:
both annotations describe one checkpoint.
"""

from __future__ import annotations

from datetime import UTC
from typing import Final

from .env import CHECKPOINT_DIR_PREFIX, parse_checkpoint_dir_name
from .errors import ContractError
from .progress import MAX_COUNT, parse_rfc3339

LAST_CHECKPOINT_TIME_ANNOTATION: Final = "kubeckpt.io/last-checkpoint-time"
LAST_CHECKPOINT_STEP_ANNOTATION: Final = "kubeckpt.io/last-checkpoint-step"
LAST_CHECKPOINT_ANNOTATIONS: Final = (
    LAST_CHECKPOINT_TIME_ANNOTATION,
    LAST_CHECKPOINT_STEP_ANNOTATION,
)

_MAX_STEP_DIGITS: Final = len(str(MAX_COUNT))


def checkpoint_time_value(text: object) -> str | None:
    """`text` (an RFC 3339 timestamp) as the annotation holds it, or None when it is not one or
    cannot be written in UTC with a four-digit year (year 1 at +01:00 has no UTC form)."""
    if not isinstance(text, str):
        return None
    try:
        t = parse_rfc3339(text).astimezone(UTC)
    except (ContractError, OverflowError):
        return None
    # Not strftime: glibc writes year 10 as "10", which is not RFC 3339.
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}Z"


def checkpoint_step_value(location: object) -> str | None:
    """The step of a checkpoint from its location's last part (`.../checkpoint-<step>`, the only
    name the runtime writes) as the annotation holds it, or None: another name, a step beyond
    int64 (what a Go reader parses), or not a string."""
    if not isinstance(location, str):
        return None
    name = location.rstrip("/").rsplit("/", 1)[-1]
    if len(name) > len(CHECKPOINT_DIR_PREFIX) + _MAX_STEP_DIGITS:
        return None  # also keeps int() off thousands of digits
    step = parse_checkpoint_dir_name(name)
    return str(step) if step is not None and step <= MAX_COUNT else None
