"""docs/architecture.md's trace of ``make_press("ripplekv", ...)``: its files, read straight down, counted right."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_imports import SRC, graph, module_name

ROOT = SRC.parent
ROW = re.compile(r"^\| (\d+) \| `([\w/]+\.py)` \| (\d+) \|", re.MULTILINE)


def trace_rows(text: str) -> list[tuple[Path, int]]:
    """The trace table's files (under ``src/ripplekv``) and their documented line counts, in order."""
    section = text.split("## One way through the method", 1)[1].split("\n## ", 1)[0]
    return [(SRC / "ripplekv" / path, int(lines)) for _, path, lines in ROW.findall(section)]


def upward_imports(files: list[Path]) -> list[str]:
    """Each import of a traced file from a file traced before it (the trace then reads other than straight down)."""
    names = [module_name(path) for path in files]
    edges = graph(SRC / "ripplekv")
    return [f"{a} -> {b}" for i, a in enumerate(names) for b in names[:i] if b in edges[a]]


def test_the_trace_reads_straight_down_and_its_counts_are_the_files() -> None:
    rows = trace_rows((ROOT / "docs" / "architecture.md").read_text())
    files = [path for path, _ in rows]
    assert 1 <= len(rows) <= 6 and len(set(files)) == len(files), rows
    assert not upward_imports(files)
    wrong = {str(path.relative_to(SRC)): (lines, len(path.read_text().splitlines())) for path, lines in rows}
    assert all(documented == actual for documented, actual in wrong.values()), (
        f"documented vs actual lines (recount with the command in docs/architecture.md): {wrong}"
    )


def test_an_upward_import_is_seen() -> None:
    press, budget = SRC / "ripplekv/presses/ripplekv_press.py", SRC / "ripplekv/allocation/budget.py"
    assert upward_imports([press, budget]) == []
    assert upward_imports([budget, press]) == ["ripplekv.presses.ripplekv_press -> ripplekv.allocation.budget"]
