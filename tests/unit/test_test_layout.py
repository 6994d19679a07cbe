"""The test tree collects as one: pytest (rootdir mode, no __init__.py) imports each test module
by its basename, so two files of the same name in different folders stop the whole run at
collection. CI found that only after the unit tests had passed alone; this catches it there."""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
