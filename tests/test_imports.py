"""The import contract of docs/architecture.md: layers import one way, and no module circles.

Read from the source with ``ast`` (every import statement, including those inside functions), so a lazy import
that runs back up a layer counts like a top-level one; imports under ``if TYPE_CHECKING:`` never run and do not
count. Inside ``evaluation`` the subpackages are ranked the same way (``SUBLAYER_RANKS``), and no file there
exceeds ``MAX_LINES`` lines nor any of its packages ``MAX_MODULES`` modules; no file of the package anywhere exceeds
``MAX_SOURCE_LINES`` lines. ``ripplekv report`` runs without torch, transformers or kvpress.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
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
    "locking": -1,
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

# inside a layer whose package is cut into subpackages: the rank of each subpackage (or leaf module), by the same
# rule. ``evaluation.sample`` is a leaf every subpackage may import; ``evaluation`` (its __init__) only documents.
SUBLAYER_RANKS = {
    "evaluation": {"sample": -1, "tasks": 0, "suites": 1, "running": 2, "reporting": 3, "evaluation": 4},
}

# size limits of the packages in SIZE_LIMITED (docs/architecture.md): lines per file, and modules per package
# (its ``__init__`` not counted, a subpackage counted as one module)
SIZE_LIMITED = ("evaluation",)
MAX_LINES = 400
MAX_MODULES = 12
# lines per file anywhere in the package (a longer file is split by concern, as inference/shared.py was)
MAX_SOURCE_LINES = 450

# commands and modules that read JSON only: they must not import these
HEAVY = ("torch", "transformers", "kvpress")


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


def sublayer(name: str) -> str:
    """``ripplekv.evaluation.running.rows`` -> ``running``; a layer's own ``__init__`` is named by its layer."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 else parts[-1]


def backward_sublayer_import(source: str, target: str, ranks: dict[str, int]) -> list[str]:
    """``[problem]`` when ``source`` may not import ``target`` of its own layer under ``ranks``, else ``[]``."""
    a, b = sublayer(source), sublayer(target)
    if a == b:
        return []
    if a not in ranks or b not in ranks:
        return [f"{source} -> {target}: sublayer {a if a not in ranks else b} of {layer(source)} has no rank"]
    return [f"{source} -> {target}"] if ranks[b] != -1 and ranks[b] >= ranks[a] else []


def backward_imports(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = layer(source), layer(target)
            if a == b and a in SUBLAYER_RANKS:
                bad += backward_sublayer_import(source, target, SUBLAYER_RANKS[a])
                continue
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


def oversized(root: Path = PACKAGE) -> list[str]:
    """Each file over ``MAX_LINES`` lines and each package over ``MAX_MODULES`` modules in ``SIZE_LIMITED``."""
    found = []
    for name in SIZE_LIMITED:
        packages = sorted(path.parent for path in (root / name).rglob("__init__.py"))
        for path in sorted((root / name).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines (at most {MAX_LINES})")
        for package in packages:
            members = [p for p in package.iterdir() if p.suffix == ".py" and p.name != "__init__.py" or p in packages]
            if len(members) > MAX_MODULES:
                found.append(f"{package.relative_to(root)}: {len(members)} modules (at most {MAX_MODULES})")
    return found


def long_files(root: Path = PACKAGE) -> list[str]:
    """Each file of the package over ``MAX_SOURCE_LINES`` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_SOURCE_LINES:
            found.append(f"{path.relative_to(root)}: {lines} lines (at most {MAX_SOURCE_LINES})")
    return found


def test_every_layer_has_a_rank() -> None:
    assert {layer(name) for name in modules()} <= set(RANKS)


def test_every_subpackage_of_a_cut_layer_has_a_rank() -> None:
    for name, ranks in SUBLAYER_RANKS.items():
        assert {sublayer(module) for module in modules() if layer(module) == name} <= set(ranks)


def test_evaluation_files_and_packages_stay_small() -> None:
    assert oversized() == []


def test_no_source_file_is_over_the_line_limit() -> None:
    assert long_files() == []


def test_the_line_limit_catches_a_long_file_in_any_layer(tmp_path: Path) -> None:
    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "long.py").write_text("x = 1\n" * MAX_SOURCE_LINES)
    (tmp_path / "top.py").write_text("x = 1\n")
    assert long_files(tmp_path) == []  # at the limit
    (tmp_path / "inference" / "long.py").write_text("x = 1\n" * (MAX_SOURCE_LINES + 1))
    assert long_files(tmp_path) == [f"inference/long.py: {MAX_SOURCE_LINES + 1} lines (at most {MAX_SOURCE_LINES})"]


def test_reporting_reads_only_the_results_log_of_running() -> None:
    """``evaluation.reporting`` needs no torch: of ``evaluation.running`` it imports the results log alone."""
    edges = graph()
    running = {
        target
        for source, targets in edges.items()
        if source.startswith("ripplekv.evaluation.reporting")
        for target in targets
        if target.startswith("ripplekv.evaluation.running")
    }
    assert running <= {"ripplekv.evaluation.running", "ripplekv.evaluation.running.results"}


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


def test_the_contract_catches_a_backward_import_between_subpackages(tmp_path: Path) -> None:
    root = tmp_path / "ripplekv"
    for name, text in {
        "__init__.py": "",
        "evaluation/__init__.py": "",
        "evaluation/sample.py": "",
        "evaluation/suites/__init__.py": "",
        "evaluation/suites/s.py": "from ripplekv.evaluation.sample import X\n",  # the leaf: allowed
        "evaluation/running/__init__.py": "",
        "evaluation/running/r.py": "from ripplekv.evaluation.suites.s import Y\n",  # running -> suites: allowed
        "evaluation/reporting/__init__.py": "",
        "evaluation/reporting/p.py": "from ripplekv.evaluation.running.r import Z\n",  # reporting -> running: allowed
        "evaluation/tasks/__init__.py": "",
        "evaluation/tasks/t.py": "def f():\n    from ripplekv.evaluation.reporting import p\n",  # tasks -> reporting
        "evaluation/extra.py": "from ripplekv.evaluation.sample import X\n",  # no rank
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        edges = graph(root)
    finally:
        SRC = saved
    assert backward_imports(edges) == [
        "ripplekv.evaluation.extra -> ripplekv.evaluation.sample: sublayer extra of evaluation has no rank",
        "ripplekv.evaluation.tasks.t -> ripplekv.evaluation.reporting",
        "ripplekv.evaluation.tasks.t -> ripplekv.evaluation.reporting.p",
    ]


def test_the_size_check_catches_a_long_file_and_a_crowded_package(tmp_path: Path) -> None:
    package = tmp_path / "evaluation" / "running"
    package.mkdir(parents=True)
    for directory in (tmp_path / "evaluation", package):
        (directory / "__init__.py").write_text("")
    for i in range(MAX_MODULES):
        (package / f"m{i}.py").write_text("x = 1\n")
    (tmp_path / "evaluation" / "long.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path) == []  # at the limits
    (package / "one_more.py").write_text("")
    (tmp_path / "evaluation" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(tmp_path) == [
        f"evaluation/long.py: {MAX_LINES + 1} lines (at most {MAX_LINES})",
        f"evaluation/running: {MAX_MODULES + 1} modules (at most {MAX_MODULES})",
    ]


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` on this checkout's ``src`` (whatever ripplekv is installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=SRC.parent, env=env
    )


@pytest.mark.parametrize(
    "module",
    [
        "ripplekv.evaluation.reporting.stats",
        "ripplekv.evaluation.reporting.comparisons",
        "ripplekv.evaluation.reporting.report",
        "ripplekv.evaluation.reporting.plots",
        "ripplekv.evaluation.running.results",
        "ripplekv.evaluation.tasks.longbench",
        "ripplekv.presses.descriptions",
        "ripplekv.profiling.profile",
        "ripplekv.cli.report",
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
