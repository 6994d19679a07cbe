"""PyTorch integration: `CheckpointManager` (periodic, just-in-time, async, tiered checkpoints with
exact resume) and `ResumableSampler` (a DistributedSampler that resumes mid-epoch).

Importing this package imports torch; the runtime core (trainer_runtime.*) never does.
"""

from .manager import CheckpointManager, SaveResult
from .sampler import ResumableSampler
from .workers import chain as chain_worker_init
from .workers import survive_sigterm

__all__ = [
    "CheckpointManager",
    "ResumableSampler",
    "SaveResult",
    "chain_worker_init",
    "survive_sigterm",
]
