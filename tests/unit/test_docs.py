"""The docs a user follows from the README: the contract copy and the links between docs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKSPACE_CONTRACT = REPO.parent / "shared" / "DESIGN.md"


def test_contract_copy_is_the_contract() -> None:
    """docs/DESIGN.md is a verbatim copy, below its two-line header, of the workspace's contract
    (when this checkout sits in that workspace; a clone has only the copy)."""
    copy = (REPO / "docs" / "DESIGN.md").read_text()
    header, _, body = copy.partition("-->\n")
    assert header.startswith("<!--") and body.startswith("# kubeckpt")
    if WORKSPACE_CONTRACT.is_file():
        assert body == WORKSPACE_CONTRACT.read_text(), "refresh docs/DESIGN.md from shared/"


def test_relative_links_in_readme_and_docs_resolve() -> None:
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = re.sub(r"`[^`\n]*`", "", md.read_text())  # code spans hold no links
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (md.parent / target).exists(), f"{md.name}: broken link {target}"
