"""Beside transformers' KubeflowCallback (Kubeflow Trainer's status server, feature gate
TrainJobStatus): it and kubeckpt's callback report the same run, each to its own place.

KubeflowCallback posts progress to Trainer, which writes the TrainJob's status.trainerStatus
(kubeckpt's controller then leaves that field alone and keeps to its TrainingProgress). One thing
collides: when kubeckpt stops training for a just-in-time checkpoint, `trainer.train()` returns
as at the end, and KubeflowCallback's `on_train_end` would report the job 100 % done with nothing
left, on a preempted job that will resume. After such a stop that report is skipped: its last
per-step report (the real percentage) stands until the resumed run reports again.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

KUBEFLOW_CALLBACK = "KubeflowCallback"
_GUARDED = "_kubeckpt_guarded"


def guard_kubeflow_callbacks(trainer: Any, stopped: Any) -> int:
    """Wrap `on_train_end` of every KubeflowCallback in `trainer` so that it is skipped while
    `stopped()` is true; idempotent. Returns how many were wrapped now."""
    n = 0
    for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", []):
        if type(cb).__name__ != KUBEFLOW_CALLBACK or getattr(cb, _GUARDED, False):
            continue
        end = cb.on_train_end

        def on_train_end(args, state, control, _end=end, **kwargs):
            if stopped():
                log.info(
                    "kubeckpt: stopped at step %s for a just-in-time checkpoint: "
                    "KubeflowCallback's end-of-training report (100 %%) skipped",
                    state.global_step,
                )
                return None
            return _end(args, state, control, **kwargs)

        cb.on_train_end = on_train_end
        setattr(cb, _GUARDED, True)
        n += 1
    return n
