"""kubeckpt for JAX: `CheckpointManager` (needs the `jax` extra: jax, orbax-checkpoint)."""

from .manager import CheckpointManager

__all__ = ["CheckpointManager"]
