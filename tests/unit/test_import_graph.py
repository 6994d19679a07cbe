"""Which way imports point, counting every import (module-level, inside functions, under
TYPE_CHECKING): no cycles among the cluster-side packages (the library, the API package, the
webhook, the progress controller, the CLI), since a cycle means two modules that cannot be
understood or tested apart; and the pod's runtime imports none of them (the runtime image holds
trainer_runtime alone). tests/unit/reconciler/test_library_boundary.py checks the library."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("reconciler", "kubeckpt_api", "webhook", "progress_controller", "kubeckpt_cli")
RUNTIME = "trainer_runtime"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(name: str, is_package: bool, source: str, known: Iterable[str]) -> set[str]:
    """The modules of `known` that `source` (module `name`) imports. `from pkg import sub` counts
    as importing pkg.sub when that is a module, else pkg."""
    known = set(known)
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
    return {m for m in found if m in known and m != name}


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    return {
        name: imports_of(name, path.name == "__init__.py", path.read_text(), paths)
        for name, path in paths.items()
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_check_finds_a_type_checking_cycle() -> None:
    known = {"p", "p.a", "p.b", "p.c"}
    a = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    b = "def f():\n    from p import c\n"
    c = "from . import a\n"
    graph = {
        "p": set(),
        "p.a": imports_of("p.a", False, a, known),
        "p.b": imports_of("p.b", False, b, known),
        "p.c": imports_of("p.c", False, c, known),
    }
    assert graph["p.a"] == {"p.b"} and graph["p.b"] == {"p.c"} and graph["p.c"] == {"p.a"}
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert cycles({**graph, "p.c": set()}) == []


def test_no_import_cycles_in_the_cluster_side_packages() -> None:
    graph = import_graph(REPO, PACKAGES)
    assert len(graph) > 50  # every package was found
    assert cycles(graph) == []


def test_the_runtime_imports_nothing_of_the_cluster_side() -> None:
    graph = import_graph(REPO, (*PACKAGES, RUNTIME))
    runtime = {name: deps for name, deps in graph.items() if name.split(".")[0] == RUNTIME}
    assert len(runtime) > 20  # the package was found
    crossing = {
        name: sorted(dep for dep in deps if dep.split(".")[0] != RUNTIME)
        for name, deps in runtime.items()
    }
    assert {name: deps for name, deps in crossing.items() if deps} == {}
