"""The import graph of our packages, read from their source with ast (tests/unit/runtime/
test_import_graph.py for trainer_runtime, tests/unit/test_package_imports.py for the cluster side).

Every import counts: at module level, inside functions, and under `if TYPE_CHECKING:` (a circle
only the type checker sees is still two modules that cannot be read apart). `from . import
layout` imports the module `layout`, not its package (whose `__init__` Python has run already, or
is running: that is no circle); importing a name the package defines is an import of the package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "trainer_runtime"
# The framework integrations: they import torch, transformers, jax.
FRAMEWORKS = ("torch", "hf", "jax")


@dataclass(frozen=True)
class Import:
    target: str  # the module's dotted name
    top_level: bool  # runs when the importing module is imported (not inside a function)
    line: int


def modules(packages: tuple[str, ...] = (PACKAGE,)) -> dict[str, Path]:
    """Every module of `packages` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(p for pkg in packages for p in (REPO / pkg).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """What module `name` (at `path`) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[Import] = []

    def visit(node: ast.AST, top_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(a.name, top_level, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module != "__future__":
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join([*base, *([child.module] if child.module else [])])
                submodules = [f"{module}.{a.name}" for a in child.names]
                found.extend(Import(m, top_level, child.lineno) for m in submodules if m in known)
                if not all(m in known for m in submodules):  # a name defined in `module`
                    found.append(Import(module, top_level, child.lineno))
            function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, top_level and not function)

    visit(tree, True)
    return found


def import_graph(packages: tuple[str, ...] = (PACKAGE,)) -> dict[str, list[Import]]:
    """Module -> what it imports, for every module of `packages`."""
    known = modules(packages)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def internal_edges(graph: dict[str, list[Import]]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    return {
        name: {i.target for i in imports if i.target in graph} for name, imports in graph.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle: the strongly connected components of more than one module, and a
    module that imports itself (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def core_modules(graph: dict[str, list[Import]] | None = None) -> list[str]:
    """The core: everything but the framework integrations and what imports them."""
    graph = import_graph() if graph is None else graph
    edges = internal_edges(graph)
    outside = {
        m
        for m in graph
        for f in FRAMEWORKS
        if m == f"{PACKAGE}.{f}" or m.startswith(f"{PACKAGE}.{f}.")
    }
    while more := {m for m in graph if m not in outside and edges[m] & outside}:
        outside |= more  # whatever imports them, transitively
    return sorted(m for m in graph if m not in outside)
