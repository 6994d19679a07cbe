"""The process's exit code after training: decided here, once, for every adapter.

The zero-code hook (zerocode/sitecustomize.py) takes it from the attached callbacks' `exit_code`.
"""

from __future__ import annotations

from ..contract import PREEMPTED_EXIT_CODE


def exit_code(stopped: bool) -> int:
    """0, or PREEMPTED_EXIT_CODE (143) after a just-in-time stop, so that the job controller
    restarts the job instead of counting the preempted pod a success."""
    return PREEMPTED_EXIT_CODE if stopped else 0
