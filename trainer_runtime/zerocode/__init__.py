"""Zero-code mode: the runtime injected into images that never installed kubeckpt.

The webhook's init container runs `python -m trainer_runtime.zerocode.install <root>` from the
runtime image; the training container then gets `PYTHONPATH=<root>/kubeckpt-hook:<root>:<its own>`,
so Python's `site` runs our `sitecustomize` (see `sitecustomize.py` here), which attaches
`kubeckpt_trainer` to every HF Trainer once transformers is imported. See docs/zero-code.md.

Nothing here imports anything outside the standard library.
"""

from __future__ import annotations

from typing import Final

PACKAGE: Final = "trainer_runtime"
# Not a valid module name, so putting `<root>` on sys.path cannot shadow a user's `hook` package.
HOOK_DIR: Final = "kubeckpt-hook"
HOOK_MODULE: Final = "sitecustomize.py"


def pythonpath_entries(root: str) -> list[str]:
    """The entries to put first on PYTHONPATH: the hook directory, then the package's parent."""
    root = root.rstrip("/") or "/"
    return [f"{root.rstrip('/')}/{HOOK_DIR}", root]


__all__ = ["HOOK_DIR", "HOOK_MODULE", "PACKAGE", "pythonpath_entries"]
