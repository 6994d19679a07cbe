"""kubeckpt's save protocol, framework-neutral and standard-library only.

One protocol, several adapters (torchtitan's checkpointer with its backends): `Checkpointer` is
what an adapter drives; it needs an `Agreement` over the framework's collectives, a `stage`
callable returning a `Staged` save, and a `Loader`. trainer_runtime.torch and trainer_runtime.hf
are its adapters.
"""

from .agreement import Agreement, AgreementError, Pending, Pipelined, Solo
from .checkpointer import Checkpointer, StepDecision
from .commit import FileInfo, Member, Outcome, Report, TierCommit
from .resume import Loader, Restored, RestoreError
from .session import SaveResult, SaveSession, Staged
from .stops import StopControl

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
    "StopControl",
    "TierCommit",
]
