"""The reconciler package is a library that knows nothing of kubeckpt: no module of it imports
kubeckpt's own packages, at module level, inside a function or under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[3] / "reconciler"
PRODUCT = ("kubeckpt_api", "kubeckpt_cli", "progress_controller", "trainer_runtime", "webhook")


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every absolute import anywhere in the tree (relative ones stay inside
    the package)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def product_imports(source: str) -> list[str]:
    return [
        f"line {line}: {module}"
        for line, module in sorted(imported_modules(ast.parse(source)))
        if module.split(".")[0] in PRODUCT
    ]


def test_the_check_sees_every_kind_of_import() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import reconciler.client\n"
        "if TYPE_CHECKING:\n"
        "    from webhook.server import make_app\n"
        "def f():\n"
        "    import kubeckpt_api.optin\n"
        "    from progress_controller import main\n"
    )
    assert product_imports(source) == [
        "line 4: webhook.server",
        "line 6: kubeckpt_api.optin",
        "line 7: progress_controller",
    ]


@pytest.mark.parametrize(
    "path", sorted(LIBRARY.rglob("*.py")), ids=lambda p: str(p.relative_to(LIBRARY))
)
def test_library_module_imports_nothing_of_kubeckpt(path: Path) -> None:
    assert product_imports(path.read_text()) == []
