"""trainer_runtime's import graph (tests/support/import_graph.py): no import circles, and a core
that imports nothing beyond the standard library (the runtime image holds only trainer_runtime
and Python; zero-code mode injects it into images that never installed kubeckpt). The same core
is imported for real in test_runtime_core.py."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.import_graph import (
    core_modules,
    cycles,
    import_graph,
    imports_of,
    internal_edges,
)

# Third-party modules the core may import inside a function, for an optional feature only.
OPTIONAL = {
    "xxhash": "contract/manifest.py: xxh3_128 checksums (the torch extra); sha256 without it",
    "fsspec": "storage.py: s3:// tiers (the s3 extra)",
}


def test_the_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    targets = {m: {i.target for i in imports} for m, imports in graph.items()}
    # `from . import heartbeat`, `from .contract import (...)`
    assert {"trainer_runtime.heartbeat", "trainer_runtime.contract"} <= targets[
        "trainer_runtime.layout"
    ]
    # `from . import dcp as dcp_format` is the module, not the package
    assert "trainer_runtime.torch.dcp" in targets["trainer_runtime.torch.manager"]
    # inside a function: the hook imports the HF integration only once transformers is there
    hook = {i.target: i for i in graph["trainer_runtime.zerocode.sitecustomize"]}
    assert not hook["trainer_runtime.hf"].top_level
    assert hook["os"].top_level


def test_imports_for_the_type_checker_and_in_functions_count(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .checkpointer import Checkpointer\n"
        "def f():\n"
        "    from .. import layout\n"
        "    import json\n"
    )
    known = {"pkg.sub.checkpointer": source, "pkg.layout": source}
    found = {(i.target, i.top_level) for i in imports_of("pkg.sub.mod", source, known)}
    assert found == {
        ("typing", True),
        ("pkg.sub.checkpointer", True),
        ("pkg.layout", False),  # the module; not its package `pkg`
        ("json", False),
    }


def test_cycles_finds_circles_and_only_them() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}, "b": set()}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_circles_in_trainer_runtime() -> None:
    found = cycles(internal_edges(import_graph()))
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_core_imports_only_the_standard_library() -> None:
    """What a core module imports is the standard library, the core, or an optional module
    inside a function (OPTIONAL says for what)."""
    graph = import_graph()
    core = set(core_modules(graph))
    assert {"trainer_runtime.protocol", "trainer_runtime.stop", "trainer_runtime.prestop"} <= core
    assert "trainer_runtime.torch" not in core and "trainer_runtime.hf.callback" not in core
    assert "trainer_runtime.zerocode.sitecustomize" not in core  # it imports trainer_runtime.hf
    bad = [
        f"{name}:{i.line} imports {i.target}"
        for name in sorted(core)
        for i in graph[name]
        if i.target not in core
        and i.target.split(".")[0] not in sys.stdlib_module_names
        and (i.target.split(".")[0] not in OPTIONAL or i.top_level)
    ]
    assert bad == []
