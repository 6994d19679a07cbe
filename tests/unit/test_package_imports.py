"""Which way imports point, counting every import (module-level, inside functions, under
TYPE_CHECKING): no cycles among the cluster-side packages (the library, the API package, the
webhook, the progress controller, the CLI), since a cycle means two modules that cannot be
understood or tested apart; and the pod's runtime imports none of them (the runtime image holds
trainer_runtime alone). tests/unit/reconciler/test_library_boundary.py checks the library, and
tests/unit/runtime/test_import_graph.py the runtime's own graph (the same reader, with its own
tests of what it counts)."""

from __future__ import annotations

from tests.support.import_graph import cycles, import_graph, internal_edges

PACKAGES = ("reconciler", "kubeckpt_api", "webhook", "progress_controller", "kubeckpt_cli")
RUNTIME = "trainer_runtime"


def test_no_import_cycles_in_the_cluster_side_packages() -> None:
    edges = internal_edges(import_graph(PACKAGES))
    assert len(edges) > 50  # every package was found
    assert cycles(edges) == []


def test_the_runtime_imports_nothing_of_the_cluster_side() -> None:
    graph = import_graph((*PACKAGES, RUNTIME))
    runtime = {name: imports for name, imports in graph.items() if name.split(".")[0] == RUNTIME}
    assert len(runtime) > 20  # the package was found
    crossing = {
        name: sorted({i.target for i in imports if i.target.split(".")[0] in PACKAGES})
        for name, imports in runtime.items()
    }
    assert {name: deps for name, deps in crossing.items() if deps} == {}
