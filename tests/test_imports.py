"""The import contract of docs/architecture.md: layers import one way, and no module circles.

Read from the source with ``ast`` (every import statement, including those inside functions), so a lazy import
that runs back up a layer counts like a top-level one; imports under ``if TYPE_CHECKING:`` never run and do not
count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "ripplekv"

# rank of each layer: a module may import modules of its own package or of a lower rank (never an equal rank of
# another package). ``version`` is a leaf every layer may import; ``ripplekv`` itself (the package's __init__)
# only re-exports.
RANKS = {
    "version": -1,
    "validation": -1,
    "models": 0,
    "distributed": 0,
    "allocation": 0,
    "profiling": 1,
    "presses": 2,
    "inference": 3,
    "evaluation": 4,
    "analysis": 5,
    "cli": 6,
    "ripplekv": 7,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(path): path for path in sorted(root.rglob("*.py"))}


def imported(path: Path, known: set[str]) -> Iterator[str]:
    """The ripplekv modules ``path`` imports (``from a.b import c`` names ``a.b.c`` when that is a module)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {  # imports under ``if TYPE_CHECKING:`` never run
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base in known:
                yield base
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    yield f"{base}.{alias.name}"


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(root)
    return {name: set(imported(path, set(found))) - {name} for name, path in found.items()}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def backward_imports(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = layer(source), layer(target)
            if a == b or b in ("version", "validation"):
                continue
            if a not in RANKS or b not in RANKS:
                bad.append(f"{source} -> {target}: layer {a if a not in RANKS else b} has no rank")
            elif RANKS[b] >= RANKS[a] and a != "ripplekv" or a == "ripplekv" and b == "ripplekv":
                bad.append(f"{source} -> {target}")
    return bad


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    pruned = edges
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(pruned.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    for node in sorted(pruned):
        if node not in index:
            visit(node)
    return found


def test_every_layer_has_a_rank() -> None:
    assert {layer(name) for name in modules()} <= set(RANKS)


def test_no_import_runs_back_up_a_layer() -> None:
    assert backward_imports(graph()) == []


def test_no_circles_among_modules() -> None:
    assert circles(graph()) == []


def test_the_contract_catches_a_backward_import_and_a_circle(tmp_path: Path) -> None:
    root = tmp_path / "ripplekv"
    for name, text in {
        "__init__.py": "",
        "models/__init__.py": "",
        "models/a.py": "from ripplekv.presses.b import X\n",  # models may not import presses
        "presses/__init__.py": "",
        "presses/b.py": "def f():\n    from ripplekv.presses import c\n",
        "presses/c.py": "from ripplekv.presses.b import f\n",  # b <-> c, through a lazy import
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        edges = graph(root)
    finally:
        SRC = saved
    assert backward_imports(edges) == ["ripplekv.models.a -> ripplekv.presses.b"]
    assert circles(edges) == [["ripplekv.presses.b", "ripplekv.presses.c"]]


@pytest.mark.parametrize("module", ["ripplekv.evaluation.reporting.stats", "ripplekv.cli.report"])
def test_json_only_modules_import_without_torch(module: str) -> None:
    code = (
        f"import sys, {module}; bad = [m for m in ('torch', 'transformers', 'kvpress') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SRC.parent)
    assert out.stdout.strip() == "[]", f"importing {module} loads {out.stdout.strip()}"
