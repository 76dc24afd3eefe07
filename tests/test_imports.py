"""The import contract of docs/architecture.md: two packages, each in layers imported one way, and no circle.

The library ``ripplekv`` never imports the evaluation harness ``ripplekv_eval``; the harness may import the library.
Read from the source with ``ast`` (every import statement, including those inside functions), so a lazy import
that runs back up a layer counts like a top-level one; imports under ``if TYPE_CHECKING:`` never run and do not
count. ``ripplekv report`` runs without torch, transformers or kvpress, and ``pip install ripplekv`` alone pulls
none of the harness's dependencies.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "ripplekv"
HARNESS = SRC / "ripplekv_eval"
PYPROJECT = SRC.parent / "pyproject.toml"

# rank of each layer of a package: a module may import modules of its own layer or of a lower rank (never an equal
# rank of another layer). Rank -1 marks leaves every layer may import; the package's own __init__ ranks last.
RANKS = {
    "ripplekv": {
        "version": -1,
        "lazy": -1,
        "validation": -1,
        "locking": -1,
        "models": 0,
        "distributed": 0,
        "allocation": 0,
        "profiling": 1,
        "presses": 2,
        "inference": 3,
        "cli": 4,
        "ripplekv": 5,
    },
    "ripplekv_eval": {
        "sample": -1,
        "tasks": 0,
        "suites": 1,
        "fastpath": 1,
        "running": 2,
        "reporting": 3,
        "analysis": 4,
        "cli": 5,
        "ripplekv_eval": 6,
    },
}

# commands and modules that read JSON only: they must not import these
HEAVY = ("torch", "transformers", "kvpress")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(*roots: Path) -> dict[str, Path]:
    return {module_name(path): path for root in roots or (PACKAGE, HARNESS) for path in sorted(root.rglob("*.py"))}


def imported(path: Path, known: set[str], typing: bool = False) -> Iterator[str]:
    """The ripplekv modules ``path`` imports (``from a.b import c`` names ``a.b.c`` when that is a module); those
    under ``if TYPE_CHECKING:`` only with ``typing`` (they never run, but a circle through them is still one)."""
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
        if id(node) in typing_only and not typing:
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


def graph(*roots: Path, typing: bool = False) -> dict[str, set[str]]:
    found = modules(*roots)
    return {name: set(imported(path, set(found), typing)) - {name} for name, path in found.items()}


def package(name: str) -> str:
    return name.split(".")[0]


def layer(name: str) -> str:
    """``ripplekv.presses.registry`` -> ``presses``; a package's own ``__init__`` is named by its package."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def backward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Each import against the contract: the library importing the harness, or a layer importing one not below it."""
    bad = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if package(target) != package(source):
                if package(source) == "ripplekv":
                    bad.append(f"{source} -> {target}: the library imports the harness")
                continue
            ranks = RANKS[package(source)]
            a, b = layer(source), layer(target)
            if a not in ranks or b not in ranks:
                bad.append(f"{source} -> {target}: layer {a if a not in ranks else b} has no rank")
            elif a != b and ranks[b] != -1 and ranks[b] >= ranks[a]:
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
    for name in modules():
        assert layer(name) in RANKS[package(name)], name


def test_reporting_reads_only_the_results_log_of_running() -> None:
    """``evaluation.reporting`` needs no torch: of ``evaluation.running`` it imports the results log alone."""
    edges = graph()
    running = {
        target
        for source, targets in edges.items()
        if source.startswith("ripplekv_eval.reporting")
        for target in targets
        if target.startswith("ripplekv_eval.running")
    }
    assert running <= {"ripplekv_eval.running", "ripplekv_eval.running.results"}


def test_no_import_runs_back_up_a_layer() -> None:
    assert backward_imports(graph()) == []


def test_no_circles_among_modules() -> None:
    assert circles(graph(typing=True)) == []


def test_the_method_table_holds_its_factories_and_the_graph_sees_their_imports() -> None:
    """A factory is an object of the table, not a name resolved at run time (an import the graph cannot read, which
    hid a circle): each is defined in the table's module or one it imports, and outside the package inits (PEP 562)
    no module resolves a module by name but the model assets' packages (``models/sources.py``, not ripplekv's)."""
    from ripplekv.presses.method_spec import METHOD_TABLE

    edges, table = graph(), "ripplekv.presses.method_spec"
    for name, method in METHOD_TABLE.items():
        module = getattr(method.factory, "func", method.factory).__module__  # a partial's function
        assert module == table or module in edges[table], name
    by_name = [
        name
        for name, path in modules().items()
        if path.name != "__init__.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("resolve_name", "import_module")
    ]
    assert sorted(set(by_name)) == ["ripplekv.lazy", "ripplekv.models.sources"]  # package namespaces; model aliases
    assert {"ripplekv.presses.ripplekv_press", "ripplekv.presses.per_prompt_press"} <= edges[table]  # lazy imports


def test_package_inits_import_nothing_and_names_come_from_their_modules() -> None:
    """A package's ``__init__`` imports none of the package's modules (its names resolve on first use, PEP 562;
    ``ripplekv_eval.cli`` imports only the ``eval`` extra), and ``src/`` and ``tests/`` import each name from the
    module that defines it, never through an ``__init__`` (docs/architecture.md)."""
    found = modules()
    inits = {name for name, path in found.items() if path.name == "__init__.py"}
    for name in inits:
        assert set(imported(found[name], set(found))) <= {"ripplekv.version", "ripplekv.lazy"}, name
    through = [
        f"{path.name}: from {node.module} import {alias.name}"
        for path in [*found.values(), *sorted((SRC.parent / "tests").glob("*.py"))]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in inits
        for alias in node.names
        if f"{node.module}.{alias.name}" not in found
    ]
    assert through == []


def seeded_graph(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        return graph(tmp_path / "ripplekv", tmp_path / "ripplekv_eval")
    finally:
        SRC = saved


def test_the_contract_catches_a_backward_import_and_a_circle(tmp_path: Path) -> None:
    edges = seeded_graph(
        tmp_path,
        {
            "ripplekv/__init__.py": "",
            "ripplekv/models/__init__.py": "",
            "ripplekv/models/a.py": "from ripplekv.presses.b import X\n",  # models may not import presses
            "ripplekv/presses/__init__.py": "",
            "ripplekv/presses/b.py": "def f():\n    from ripplekv.presses import c\n",
            "ripplekv/presses/c.py": "from ripplekv.presses.b import f\n",  # b <-> c, through a lazy import
            "ripplekv_eval/__init__.py": "",
        },
    )
    assert backward_imports(edges) == ["ripplekv.models.a -> ripplekv.presses.b"]
    assert circles(edges) == [["ripplekv.presses.b", "ripplekv.presses.c"]]


def test_the_contract_catches_the_library_importing_the_harness_and_a_backward_layer(tmp_path: Path) -> None:
    edges = seeded_graph(
        tmp_path,
        {
            "ripplekv/__init__.py": "",
            "ripplekv/presses/__init__.py": "",
            "ripplekv/presses/p.py": "def f():\n    import ripplekv_eval.sample\n",  # a lazy import of the harness
            "ripplekv_eval/__init__.py": "",
            "ripplekv_eval/sample.py": "from ripplekv.presses.p import f\n",  # the harness on the library: allowed
            "ripplekv_eval/suites/__init__.py": "",
            "ripplekv_eval/suites/s.py": "from ripplekv_eval.sample import X\n",  # the leaf: allowed
            "ripplekv_eval/running/__init__.py": "",
            "ripplekv_eval/running/r.py": "from ripplekv_eval.suites.s import Y\n",  # running -> suites: allowed
            "ripplekv_eval/tasks/__init__.py": "",
            "ripplekv_eval/tasks/t.py": "def f():\n    from ripplekv_eval.running import r\n",  # tasks -> running
            "ripplekv_eval/extra.py": "from ripplekv_eval.sample import X\n",  # no rank
        },
    )
    assert backward_imports(edges) == [
        "ripplekv.presses.p -> ripplekv_eval.sample: the library imports the harness",
        "ripplekv_eval.extra -> ripplekv_eval.sample: layer extra has no rank",
        "ripplekv_eval.tasks.t -> ripplekv_eval.running",
        "ripplekv_eval.tasks.t -> ripplekv_eval.running.r",
    ]


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in requirements}


def third_party_imports(root: Path) -> set[str]:
    """Top-level names of the modules a package's source imports that are neither standard nor ripplekv's."""
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and not name.startswith("ripplekv")}


def test_the_library_alone_pulls_none_of_the_harness_dependencies() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    base = requirement_names(project["dependencies"])
    harness = requirement_names(project["optional-dependencies"]["eval"])
    assert harness and not harness & base, harness & base
    library = third_party_imports(PACKAGE)
    assert not library & harness, f"the library imports {library & harness}, dependencies of the harness only"
    # what the library imports comes with its own dependencies (tokenizers with transformers; ray is the extra
    # `ray`, imported where --workers asks for it)
    assert library - base <= {"tokenizers", "ray"}, library - base
    assert third_party_imports(HARNESS) & harness  # the harness does use them


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` on this checkout's ``src`` (whatever ripplekv is installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=SRC.parent, env=env
    )


@pytest.mark.parametrize(
    "module",
    [
        "ripplekv_eval.reporting.stats",
        "ripplekv_eval.reporting.report",
        "ripplekv_eval.reporting.plots",
        "ripplekv_eval.running.results",
        "ripplekv_eval.tasks.longbench",
        "ripplekv.presses.descriptions",
        "ripplekv.profiling.profile",
        "ripplekv_eval.cli.report",
        "ripplekv.cli.main",
    ],
)
def test_json_only_modules_import_without_torch(module: str) -> None:
    code = f"import sys, {module}; bad = [m for m in {HEAVY!r} if m in sys.modules]; print(bad)"
    out = run_python(code)
    assert out.stdout.strip() == "[]", f"importing {module} loads {out.stdout.strip()}"


@pytest.mark.parametrize("fmt", ["md", "json", "csv"])
def test_ripplekv_report_runs_without_torch(fmt: str, tmp_path: Path) -> None:
    """``ripplekv report`` of a committed run, as the ``ripplekv`` script runs it (``cli.main``, plots included):
    torch, transformers and kvpress are not in ``sys.modules`` when the process exits."""
    run = SRC.parent / "benchmarks" / "results" / "ruler-4k-fidelity"
    code = (
        "import atexit, runpy, sys; "
        f"atexit.register(lambda: print('loaded:', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)); "
        "sys.argv = ['ripplekv', *sys.argv[1:]]; runpy.run_module('ripplekv.cli.main', run_name='__main__')"
    )
    plots = ["--plots", str(tmp_path / "plots")] if fmt == "md" and importlib.util.find_spec("matplotlib") else []
    out = run_python(code, "report", str(run), "--format", fmt, *plots)
    assert out.stderr.strip().splitlines()[-1] == "loaded: []", out.stderr
    if fmt == "json":
        assert json.loads(out.stdout)["format"] == "ripplekv-report/1"
    else:
        assert "niah_single_noise_number" in out.stdout
