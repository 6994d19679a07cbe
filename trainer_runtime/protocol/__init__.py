"""kubeckpt's save protocol, framework-neutral and standard-library only.

One protocol, several adapters (torchtitan's checkpointer with its backends): `Checkpointer` is
what an adapter drives; it needs an `Agreement` over the framework's collectives, a `stage`
callable returning a `Staged` save, and a `Loader`. trainer_runtime.torch, trainer_runtime.jax
and trainer_runtime.hf are its adapters (trainer_runtime/adapter.py: their shared loop); the
just-in-time stop on top of it is trainer_runtime.stop.
"""

from .agreement import Agreement, AgreementError, Pending, Pipelined, Solo
from .checkpointer import Checkpointer, StepDecision
from .commit import FileInfo, Member, Outcome, Report, TierCommit
from .resume import Loader, Restored, RestoreError
from .session import SaveResult, SaveSession, Staged

__all__ = [
    "Agreement",
    "AgreementError",
    "Checkpointer",
    "FileInfo",
    "Loader",
    "Member",
    "Outcome",
    "Pending",
    "Pipelined",
    "Report",
    "RestoreError",
    "Restored",
    "SaveResult",
    "SaveSession",
    "Solo",
    "Staged",
    "StepDecision",
    "TierCommit",
]
