"""In-pod runtime for kubeckpt: progress, checkpoints and the shutdown path (stdlib-only core)."""

__version__ = "0.1.0"
