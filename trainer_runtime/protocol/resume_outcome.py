"""What restore found, and the decision it means: resume, start fresh, or stop the process.

Pure (no I/O): `Checkpointer.restore` acts on the decision. Checkpoints that exist but all fail
verification must not quietly restart training from step 0 (a user would learn it from the loss
curve): by default the process stops with UNVERIFIABLE_EXIT_CODE and a message naming each bad
checkpoint and why; CHECKPOINT_ON_UNVERIFIABLE=StartFresh (the policy's
`onUnverifiableCheckpoints`) starts from step 0 with a warning instead. A manifest of a format
version this runtime does not know is not a bad checkpoint: the process stops with
UNSUPPORTED_FORMAT_EXIT_CODE whatever the setting, asking for a newer runtime image.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ..contract.env import (
    ON_UNVERIFIABLE_FAIL,
    ON_UNVERIFIABLE_START_FRESH,
    UNSUPPORTED_FORMAT_EXIT_CODE,
    UNVERIFIABLE_EXIT_CODE,
)

# Reasons a candidate was passed over.
UNVERIFIED: Final = "Unverified"  # fetch or verification against its manifest failed
UNLOADABLE: Final = "Unloadable"  # verified, but the framework could not load it
UNSUPPORTED: Final = "UnsupportedFormatVersion"  # a newer runtime's manifest
# The reasons the progress record gives the controller (condition CheckpointsUnverifiable).
CHECKPOINTS_UNVERIFIABLE: Final = "CheckpointsUnverifiable"  # none verifies: the process stopped
STARTED_FRESH: Final = "StartedFresh"  # none verifies: trained from step 0 (StartFresh)
MAX_REASONS: Final = 3  # problems kept per checkpoint (a sharded one may list thousands)


@dataclass(frozen=True)
class Rejected:
    """A checkpoint restore passed over: where it is, the kind (UNVERIFIED, ...), and why."""

    location: str
    kind: str
    reasons: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.location}: {'; '.join(self.reasons) or self.kind}"


@dataclass(frozen=True)
class ResumeOutcome:
    """What restore did: `restored` is the step loaded (None: none), `rejected` every candidate
    passed over before it, newest first."""

    restored: int | None
    rejected: tuple[Rejected, ...] = ()


class Action(StrEnum):
    RESUME = "Resume"
    START_FRESH = "StartFresh"
    FAIL = "Fail"


@dataclass(frozen=True)
class ResumeDecision:
    action: Action
    message: str = ""  # for the log (a warning when starting fresh, the error when failing)
    exit_code: int | None = None  # with FAIL
    reason: str | None = None  # with FAIL or a warned START_FRESH: the condition's reason
    rejected: tuple[Rejected, ...] = ()  # what the message names


def decide_resume(outcome: ResumeOutcome, on_unverifiable: str) -> ResumeDecision:
    """The action for `outcome` under the CHECKPOINT_ON_UNVERIFIABLE setting."""
    if on_unverifiable not in (ON_UNVERIFIABLE_FAIL, ON_UNVERIFIABLE_START_FRESH):
        raise ValueError(f"unknown onUnverifiableCheckpoints value {on_unverifiable!r}")
    rejected = outcome.rejected
    unsupported = [r for r in rejected if r.kind == UNSUPPORTED]
    if unsupported:
        # Restore stops at the first one (newest first): nothing older was loaded over it.
        return ResumeDecision(
            Action.FAIL,
            "a checkpoint was written by a newer kubeckpt runtime; upgrade the runtime image: "
            + unsupported[0].describe(),
            UNSUPPORTED_FORMAT_EXIT_CODE,
            UNSUPPORTED,
            tuple(unsupported),
        )
    if outcome.restored is not None:
        skipped = "; ".join(r.describe() for r in rejected)
        message = f"newer checkpoints were skipped: {skipped}" if rejected else ""
        return ResumeDecision(Action.RESUME, message, rejected=rejected)
    unverified = tuple(r for r in rejected if r.kind == UNVERIFIED)
    if not unverified:  # no checkpoint at all, or only ones this model cannot load (as before)
        return ResumeDecision(Action.START_FRESH, rejected=rejected)
    names = "; ".join(r.describe() for r in unverified)
    count = f"{len(unverified)} checkpoint{'s' if len(unverified) > 1 else ''}"
    if on_unverifiable == ON_UNVERIFIABLE_START_FRESH:
        return ResumeDecision(
            Action.START_FRESH,
            f"none of {count} verifies, starting from step 0 "
            f"(onUnverifiableCheckpoints: StartFresh): {names}",
            reason=CHECKPOINTS_UNVERIFIABLE,
            rejected=unverified,
        )
    return ResumeDecision(
        Action.FAIL,
        f"none of {count} verifies; not starting from step 0 (set the policy's "
        f"onUnverifiableCheckpoints to StartFresh to allow it): {names}",
        UNVERIFIABLE_EXIT_CODE,
        CHECKPOINTS_UNVERIFIABLE,
        unverified,
    )


class ResumeRefused(SystemExit):
    """Ends the training process with the decision's exit code (a SystemExit, so a script's
    `except Exception` does not carry on training from step 0; `finally:` blocks still run)."""

    def __init__(self, decision: ResumeDecision) -> None:
        super().__init__(decision.exit_code)
        self.decision = decision

    def __str__(self) -> str:
        return self.decision.message
