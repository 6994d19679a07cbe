"""`kubeckpt-prestop`, the container's preStop hook: the module pyproject's console script names
(`trainer_runtime.prestop:main`), and `python -m trainer_runtime.prestop` where the package is only
on the path. The hook itself is trainer_runtime/stop/prestop.py, beside the triggers it talks to.
"""

from __future__ import annotations

import sys

from .stop.prestop import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
