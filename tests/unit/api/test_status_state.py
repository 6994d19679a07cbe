"""kubeckpt_api.status: `state_of` says one of STATES, the vocabulary the CLI and docs/contract.md
use, whatever the conditions, and every state in it is one a status can reach."""

from __future__ import annotations

import itertools
from typing import Any

from kubeckpt_api.status import (
    COMPLETED,
    PROGRESSING,
    STALLED,
    STATES,
    state_of,
)

STATUSES = (None, "True", "False", "Unknown")
REASONS = ("JobFailed", "Suspended", "NoRank0Pod", "ProgressReported", "Completed")


def status_with(conds: dict[str, tuple[str, str] | None], step: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "conditions": [
            {"type": t, "status": s, "reason": r} for t, c in conds.items() if c for s, r in [c]
        ]
    }
    if step is not None:
        out["step"] = step
    return out


def test_every_combination_of_conditions_maps_into_states() -> None:
    options = [None, *itertools.product(STATUSES[1:], REASONS)]
    reached = set()
    for prog, stall, done, step in itertools.product(options, options, options, (None, 3)):
        state = state_of(status_with({PROGRESSING: prog, STALLED: stall, COMPLETED: done}, step))
        assert state in STATES, (prog, stall, done, step)
        reached.add(state)
    assert reached == set(STATES)
