"""The HF tests need transformers: fail, saying how to get it, rather than skip."""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - only on an incomplete install
    raise ImportError(
        "tests/runtime/hf needs transformers: run `make venv` (the dev extra installs it)"
    ) from e
