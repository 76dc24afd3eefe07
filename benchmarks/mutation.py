"""Mutation testing of RippleKV's core: seed one small bug at a time and check that the fast tests catch it.

A self-contained mutation tool (no third-party mutation package), run as a benchmark, not in CI:

    PYTHONPATH=src nice -n 10 python benchmarks/mutation.py                      # every module below
    PYTHONPATH=src nice -n 10 python benchmarks/mutation.py --module allocation  # modules whose path has it
    python benchmarks/mutation.py --summary                                      # tables only, from the results

Each mutant is one change of the abstract syntax tree of one module (the operators are listed in
:data:`OPERATORS`): an arithmetic, comparison or boolean operator swapped, a ``not`` or a unary minus dropped, a
number increased by one, ``True``/``False`` flipped, ``break``/``continue`` swapped. Docstrings, annotations,
strings, f-strings and the messages of ``raise`` and of logging or warning calls are never mutated (a changed
message is a changed message, not a bug). The module is compiled from the mutated tree and imported in place of
its file, in a process forked from one that has already imported torch, transformers and kvpress, and the
module's tests run under pytest there (``-x``, real-model and GPU tests deselected): of its test files
(:data:`MODULES`), the tests that executed the mutated lines in the unmutated run (traced once per module), fastest
first; every test for a line run at import. A test failure (or an error while importing the mutated module) kills
the mutant; a run past its time limit (15 s plus twice the selected tests' traced time, in CPU seconds of the child,
so a busy or paused machine does not cause one) is a timeout, counted as killed. Mutants of lines no test
executes are survivors without a run ("no coverage").

Results are appended to ``benchmarks/results/mutation/results.jsonl`` one mutant at a time, keyed by the digest
of the module's source and of its test files, so an interrupted run resumes where it stopped; a module whose
source changed is mutated again, and only its survivors rerun after its tests change. ``summary.json`` and
``summary.txt`` there count every module's mutants (killed, timeout, survived, no coverage, equivalent by
review) and ``survivors.txt`` lists the survivors to triage. Mutants reviewed as equivalent (no test can tell
them from the original: the same behaviour) are listed with a reason each in ``benchmarks/mutation_equivalent.tsv``
and left out of the kill rate: ``(killed + timeout) / (mutants - equivalent)``.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
OUT = ROOT / "benchmarks" / "results" / "mutation"
EQUIVALENT = ROOT / "benchmarks" / "mutation_equivalent.tsv"

# The files in scope and the fast tests that cover each: the one place to update when modules move. An entry
# "path::name" mutates only the top-level function or class ``name`` of that file.
RELATIONS = (  # run for every module
    "tests/test_mutation_relations.py",
    "tests/test_contracts.py",
    "tests/test_contracts_profiling.py",
    "tests/test_mutation_house.py",
)
ALLOCATION_TESTS = ("tests/test_allocation.py", "tests/test_schedules.py", *RELATIONS)
PER_PROMPT_TESTS = ("tests/test_per_prompt_rules.py", "tests/test_relations_allocators.py", *RELATIONS)
PROFILING_TESTS = (
    "tests/test_profiling.py",
    "tests/test_profiling_numerics.py",
    "tests/test_profiling_continuation.py",
    *RELATIONS,
)
STATS_TESTS = ("tests/test_significance.py", "tests/test_report.py", *RELATIONS)
PRESS_TESTS = (
    "tests/test_per_prompt_press.py",
    "tests/test_relations_models.py",
    "tests/test_lava_full.py",
    "tests/test_mutation_presses.py",
    "tests/test_mutation_press_edges.py",
    *RELATIONS,
)
CHUNK_TESTS = (
    "tests/test_chunked_prefill.py",
    "tests/test_relations_models.py",
    "tests/test_mutation_inference.py",
    "tests/test_mutation_models.py",
    *RELATIONS,
)
REPORT_TESTS = (
    "tests/test_report.py",
    "tests/test_relations_reports.py",
    "tests/test_mutation_reports.py",
    "tests/test_mutation_runs.py",
    *RELATIONS,
)
RUN_TESTS = (
    "tests/test_results_resume.py",
    "tests/test_relations_runs.py",
    "tests/test_mutation_reports.py",
    "tests/test_mutation_runs.py",
    *RELATIONS,
)
# issue 32: the traced path of make_press("ripplekv") and the presses' modules after the rework
TRACED_TESTS = (
    "tests/test_presses.py",
    "tests/test_method_spec.py",
    "tests/test_token_budgets.py",
    "tests/test_schedules.py",
    "tests/test_scorers.py",
    "tests/test_kvpress_wrappers.py",
    *RELATIONS,
)
FASTPATH_TESTS = (
    "tests/test_eval_shared.py",
    "tests/test_chunked_prefill.py",
    "tests/test_per_prompt_press.py",
    "tests/test_relations_models.py",
    "tests/test_fastpath_unknown_press.py",
    *RELATIONS,
)
MODULES: dict[str, tuple[str, ...]] = {
    "ripplekv/allocation/budget.py": tuple(
        dict.fromkeys(ALLOCATION_TESTS + PER_PROMPT_TESTS + ("tests/test_token_budgets.py", "tests/test_presses.py"))
    ),
    "ripplekv/allocation/schedules.py": ALLOCATION_TESTS,
    "ripplekv/allocation/per_prompt.py": PER_PROMPT_TESTS + ("tests/test_per_prompt_press.py",),
    "ripplekv/allocation/cake.py": PER_PROMPT_TESTS,
    "ripplekv/allocation/squeezeattention.py": PER_PROMPT_TESTS + ("tests/test_squeeze_kmeans.py",),
    "ripplekv/allocation/dynamickv.py": PER_PROMPT_TESTS,
    "ripplekv/allocation/lava.py": PER_PROMPT_TESTS
    + ("tests/test_mutation_presses.py", "tests/test_mutation_press_edges.py"),
    "ripplekv/profiling/checkpoint.py": PROFILING_TESTS,
    "ripplekv/profiling/profile.py": (*PROFILING_TESTS, "tests/test_profile_setting.py"),
    "ripplekv/profiling/sensitivity.py": PROFILING_TESTS,
    "ripplekv/profiling/passes.py": PROFILING_TESTS,
    "ripplekv/profiling/noise.py": PROFILING_TESTS,
    "ripplekv/profiling/divergence.py": PROFILING_TESTS,
    "ripplekv/profiling/damage_profile.py": ("tests/test_analysis.py", *RELATIONS),
    "ripplekv/profiling/calibration.py": ("tests/test_calibration.py", *RELATIONS),
    "ripplekv/profiling/haystack.py": ("tests/test_calibration.py", *RELATIONS),
    "ripplekv_eval/fastpath/fidelity.py": ("tests/test_fidelity.py", *RELATIONS),
    # issue 44: teacher forcing and its KL moved into the library; the choice of a profile's r and gamma
    "ripplekv/inference/teacher_forcing.py": ("tests/test_fidelity.py", "tests/test_profile_setting.py", *RELATIONS),
    "ripplekv/inference/setting.py": ("tests/test_profile_setting.py", *RELATIONS),
    "ripplekv_eval/running/rows.py::greedy_agreement": ("tests/test_fidelity.py", *RELATIONS),
    "ripplekv_eval/reporting/stats.py": STATS_TESTS,
    # issue 26: the modules added for the per-prompt allocators, their presses and statistics, the chunked prefill
    # and the reports
    "ripplekv/allocation/lava_heads.py": ("tests/test_lava_full.py", "tests/test_mutation_presses.py", *RELATIONS),
    "ripplekv/presses/lava_press.py": (
        "tests/test_lava_full.py",
        "tests/test_mutation_presses.py",
        "tests/test_mutation_press_edges.py",
        *RELATIONS,
    ),
    "ripplekv/presses/lava_scorer.py": ("tests/test_lava_full.py", "tests/test_mutation_presses.py", *RELATIONS),
    "ripplekv/presses/per_prompt_press.py": PRESS_TESTS,
    "ripplekv_eval/fastpath/score_memo.py": (
        "tests/test_score_memo.py",
        "tests/test_relations_models.py",
        "tests/test_mutation_presses.py",
        "tests/test_prescore.py",
        *RELATIONS,
    ),
    "ripplekv_eval/fastpath/derive.py": FASTPATH_TESTS + ("tests/test_score_memo.py",),
    # the table and, since issue 45, every method's factory (factories.py's tests joined it)
    "ripplekv/presses/method_spec.py": TRACED_TESTS
    + (
        "tests/test_tune.py",
        "tests/test_mutation_presses.py",
        "tests/test_mutation_press_edges.py",
        "tests/test_ada_press.py",
        "tests/test_lava_full.py",
    ),
    "ripplekv/presses/method_lists.py": ("tests/test_method_spec.py", "tests/test_tune.py", *RELATIONS),
    "ripplekv_eval/fastpath/recording_press.py": (
        "tests/test_chunked_prefill.py",
        "tests/test_relations_models.py",
        "tests/test_mutation_inference.py",
        "tests/test_prescore.py",
        *RELATIONS,
    ),
    "ripplekv_eval/fastpath/hidden_tail.py": (
        "tests/test_eval_shared.py",
        "tests/test_mutation_inference.py",
        "tests/test_prescore.py",
        *RELATIONS,
    ),
    "ripplekv/models/chunked_prefill.py": CHUNK_TESTS,
    "ripplekv_eval/fastpath/padded.py": CHUNK_TESTS + ("tests/test_batched.py",),
    "ripplekv/models/layer_types.py": CHUNK_TESTS + ("tests/test_sliding_window.py",),
    "ripplekv/models/shared_prefix.py": CHUNK_TESTS,
    "ripplekv_eval/reporting/report.py": REPORT_TESTS,
    "ripplekv_eval/running/results.py": RUN_TESTS,
    # issue 32: the modules of the traced path, the presses and the fast path new or rewritten by the rework
    "ripplekv/presses/registry.py": TRACED_TESTS,
    "ripplekv/presses/ripplekv_press.py": TRACED_TESTS,
    "ripplekv/presses/layer_budget_press.py": TRACED_TESTS
    + ("tests/test_sliding_window.py", "tests/test_mutation_inference.py"),
    "ripplekv/presses/selection_window.py": TRACED_TESTS
    + ("tests/test_per_prompt_press.py", "tests/test_relations_models.py"),
    "ripplekv/presses/layer_budget_ada_press.py": ("tests/test_ada_press.py", "tests/test_eval_shared.py", *RELATIONS),
    "ripplekv/models/headwise.py": (
        "tests/test_headwise.py",
        "tests/test_ada_press.py",
        "tests/test_lava_full.py",
        *RELATIONS,
    ),
    "ripplekv_eval/fastpath/batched.py": (
        "tests/test_batched.py",
        "tests/test_mutation_inference.py",
        "tests/test_sliding_window.py",
        *RELATIONS,
    ),
    "ripplekv_eval/fastpath/record.py": FASTPATH_TESTS + ("tests/test_score_memo.py",),
}
WALL_FACTOR = 4
"""A child's wall-time limit in multiples of its CPU-time limit (see :func:`run_forked`)."""
MIN_WALL = 600.0
"""The least wall time a child gets, in seconds: a pause of the run for a CI run elsewhere must not end it."""
PYTEST_ARGS = ("-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu", "--no-header", "-o", "addopts=")
PRELOAD = ("torch", "numpy", "scipy.stats", "transformers", "kvpress", "pytest", "hypothesis", "matplotlib.pyplot")
CONFTEST = "tests/conftest.py"

# operator class -> replacement classes (one mutant each)
BINARY = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Div,),
    ast.Div: (ast.Mult,),
    ast.FloorDiv: (ast.Div,),
    ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,),
    ast.LShift: (ast.RShift,),
    ast.RShift: (ast.LShift,),
    ast.BitAnd: (ast.BitOr,),
    ast.BitOr: (ast.BitAnd,),
    ast.BitXor: (ast.BitAnd,),
}
COMPARE = {
    ast.Lt: (ast.LtE,),
    ast.LtE: (ast.Lt,),
    ast.Gt: (ast.GtE,),
    ast.GtE: (ast.Gt,),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.And: "and",
    ast.Or: "or",
}
OPERATORS = (
    "binary: + - * / // % ** << >> & | ^ each replaced (+ <-> -, * <-> /, // -> /, % -> //, ** -> *, ...)",
    "augmented assignment: the same replacements (+= -> -=, ...)",
    "comparison: < <-> <=, > <-> >=, == <-> !=, is <-> is not, in <-> not in",
    "boolean: and <-> or",
    "unary: `not x` -> `x`, `-x` -> `x`",
    "number: n -> n + 1",
    "boolean constant: True <-> False",
    "loop control: break <-> continue",
)
QUIET_CALLS = {"warn", "warning", "info", "debug", "error", "exception", "critical", "log"}


@dataclass(frozen=True)
class Site:
    """One mutant: where it is and what it changes.

    Attributes:
        module: the file, relative to ``src/``.
        index: position among the module's sites (walk order).
        line: line number of the mutated node.
        col: its column.
        label: the change, e.g. ``"< -> <="``.
        source: the stripped source line.
        end_line: last line of the mutated node.
    """

    module: str
    index: int
    line: int
    col: int
    label: str
    source: str
    end_line: int

    @property
    def key(self) -> str:
        """Identity of the mutant, independent of line numbers (for the list of equivalent mutants)."""
        return f"{self.module}\t{self.col}\t{self.label}\t{self.source}"


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """``id`` of every node never mutated: docstrings, annotations, f-strings, messages, ``__all__``."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            mark(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            for arg in [*node.args.args, *node.args.posonlyargs, *node.args.kwonlyargs]:
                mark(arg.annotation)
            for arg in (node.args.vararg, node.args.kwarg):
                if arg is not None:
                    mark(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            mark(node)
        elif isinstance(node, ast.Raise):
            mark(node.exc)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in QUIET_CALLS:
                mark(node)
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                mark(node)
        elif isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            mark(node)
    return skip


def _scoped(tree: ast.Module, only: str | None) -> list[ast.AST]:
    if only is None:
        return [tree]
    found = [n for n in tree.body if getattr(n, "name", None) == only]
    if not found:
        raise SystemExit(f"{only} is not a top-level function or class")
    return found


def _mutations(node: ast.AST) -> Iterator[tuple[str, Any]]:
    """``(label, change)`` for each mutant of ``node``; ``change`` is applied by :func:`_apply`."""
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        for new in BINARY.get(type(node.op), ()):
            yield f"{SYMBOL[type(node.op)]} -> {SYMBOL[new]}", ("op", new)
    elif isinstance(node, ast.Compare):
        for j, op in enumerate(node.ops):
            for new in COMPARE.get(type(op), ()):
                yield f"{SYMBOL[type(op)]} -> {SYMBOL[new]}", ("cmp", j, new)
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield f"{SYMBOL[type(node.op)]} -> {SYMBOL[new]}", ("op", new)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield ("not x -> x" if isinstance(node.op, ast.Not) else "-x -> x"), ("unwrap",)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            yield f"{node.value} -> {not node.value}", ("value", not node.value)
        elif isinstance(node.value, (int, float)):
            yield f"{node.value!r} -> {node.value + 1!r}", ("value", node.value + 1)
    elif isinstance(node, (ast.Break, ast.Continue)):
        new = ast.Continue if isinstance(node, ast.Break) else ast.Break
        yield f"{type(node).__name__.lower()} -> {new.__name__.lower()}", ("swap", new)


def _walk_sites(tree: ast.Module, only: str | None) -> Iterator[tuple[ast.AST, str, Any]]:
    skip = _skipped_nodes(tree)
    for scope in _scoped(tree, only):
        for node in ast.walk(scope):
            if id(node) in skip:
                continue
            for label, change in _mutations(node):
                yield node, label, change


def sites_of(module: str) -> list[Site]:
    """Every mutant of ``module`` (``path`` or ``path::name``), in a fixed order."""
    path, _, only = module.partition("::")
    text = (SRC / path).read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    return [
        Site(module, i, node.lineno, node.col_offset, label, lines[node.lineno - 1].strip(), node.end_lineno)
        for i, (node, label, _change) in enumerate(_walk_sites(tree, only or None))
    ]


def _apply(tree: ast.Module, node: ast.AST, change: tuple[Any, ...]) -> None:
    kind = change[0]
    if kind == "op":
        node.op = change[1]()
    elif kind == "cmp":
        node.ops[change[1]] = change[2]()
    elif kind == "value":
        node.value = change[1]
    else:  # unwrap or swap: replace the node in its parent
        new = node.operand if kind == "unwrap" else change[1]()
        if kind == "swap":
            ast.copy_location(new, node)
        for parent in ast.walk(tree):
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, new)
                    return
                if isinstance(value, list) and any(v is node for v in value):
                    value[[i for i, v in enumerate(value) if v is node][0]] = new
                    return
        raise AssertionError("node without a parent")


def mutated_code(module: str, index: int | None) -> Any:
    """The code object of ``module`` with mutant ``index`` applied (None: unmutated)."""
    path, _, only = module.partition("::")
    file = SRC / path
    tree = ast.parse(file.read_text())
    if index is not None:
        node, _label, change = list(_walk_sites(tree, only or None))[index]
        _apply(tree, node, change)
        ast.fix_missing_locations(tree)
    return compile(tree, str(file), "exec", dont_inherit=True)


def module_name(module: str) -> str:
    return module.partition("::")[0].removesuffix(".py").replace("/", ".")


def digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _install(module: str, code: Any) -> None:
    """Make the next ``import`` of ``module``'s dotted name execute ``code`` (in the forked child)."""
    import importlib.abc
    import importlib.machinery
    import importlib.util

    name = module_name(module)
    file = str(SRC / module.partition("::")[0])

    class Loader(importlib.machinery.SourceFileLoader):
        def get_code(self, fullname: str) -> Any:
            return code

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            return importlib.util.spec_from_file_location(fullname, file, loader=Loader(fullname, file))

    sys.meta_path.insert(0, Finder())


class _Tracer:
    """Lines of one file executed during each test (``"<collect>"``: during collection and import), and each
    test's duration, recorded in the baseline run."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.current = "<collect>"
        self.lines: dict[str, set[int]] = {}
        self.seconds: dict[str, float] = {}

    def local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines.setdefault(self.current, set()).add(frame.f_lineno)
        return self.local

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == self.file:
            self.lines.setdefault(self.current, set()).add(frame.f_lineno)
            return self.local
        return None

    # pytest hooks: the plugin attributes lines to the test running
    def pytest_runtest_setup(self, item: Any) -> None:
        self.current = item.nodeid

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration


def _child(
    module: str, code: Any, tests: tuple[str, ...], trace: Path | None, log: Path | None, cpu_limit: float | None
) -> None:
    """In the forked process: run ``tests`` over ``code`` as ``module``; never returns. Past ``cpu_limit``
    seconds of its own CPU time the kernel ends it with SIGXCPU."""
    rc = 3
    try:
        if cpu_limit is not None:
            seconds = math.ceil(cpu_limit)
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))
        fd = os.open(str(log) if log else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(ROOT)
        _install(module, code)
        import pytest
        import torch

        torch.set_num_threads(1)
        if trace is None:
            rc = int(pytest.main([*tests, *PYTEST_ARGS]))
        else:
            import threading

            tracer = _Tracer(str(SRC / module.partition("::")[0]))
            threading.settrace(tracer)
            sys.settrace(tracer)
            rc = int(pytest.main([*tests, *PYTEST_ARGS], plugins=[tracer]))
            sys.settrace(None)
            lines = {test: sorted(found) for test, found in tracer.lines.items()}
            trace.write_text(json.dumps({"lines": lines, "seconds": tracer.seconds}))
    except BaseException:  # noqa: BLE001 - any failure before or inside pytest is a failed run
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def run_forked(
    module: str, code: Any, tests: tuple[str, ...], limit: float, trace: Path | None = None, log: Path | None = None
) -> tuple[str, float, int | None]:
    """``(status, seconds, exit code)`` of one test run in a forked child; status ``pass``, ``fail`` or
    ``timeout``.

    ``limit`` is in seconds of the child's own CPU time (``RLIMIT_CPU``), so a busy machine or a paused run
    (SIGSTOP, to free the cores for something else) never turns a slow pass into a timeout; a child that
    stops using the CPU without ending (a deadlock, a sleep) is killed after :data:`WALL_FACTOR` times the limit
    of wall time, at least :data:`MIN_WALL` seconds."""
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(module, code, tests, trace, log, limit)
    wall = max(MIN_WALL, WALL_FACTOR * limit)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        seconds = time.monotonic() - started
        if done:
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
                return "timeout", seconds, None
            rc = os.waitstatus_to_exitcode(status)
            return ("pass" if rc == 0 else "fail"), seconds, rc
        if seconds > wall:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", seconds, None
        time.sleep(0.02)


def load_results() -> dict[tuple[str, int, str], dict[str, Any]]:
    """The latest result of each ``(module, index, source digest)``."""
    results: dict[tuple[str, int, str], dict[str, Any]] = {}
    path = OUT / "results.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interruption
            results[(row["module"], row["index"], row["source_sha"])] = row
    return results


def load_equivalent() -> dict[str, str]:
    """``Site.key -> reason`` from :data:`EQUIVALENT` (module, col, label, source line, reason; tab-separated)."""
    found: dict[str, str] = {}
    if EQUIVALENT.exists():
        for line in EQUIVALENT.read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            module, col, label, source, reason = line.split("\t")
            found[f"{module}\t{col}\t{label}\t{source}"] = reason
    return found


def first_runs(since: str, until: str) -> dict[str, Any]:
    """First-run kill rate of the mutants first run in ``[since, until)`` (ISO times, compared as text).

    A mutant's first run is its earliest row (per module, index and source digest), against the tests as they were
    then; reruns after new tests do not count. Mutants reviewed as equivalent are left out; a timeout is a kill.
    """
    first: dict[tuple[str, int, str], dict[str, Any]] = {}
    path = OUT / "results.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        key = (row["module"], row["index"], row["source_sha"])
        if key not in first or row["date"] < first[key]["date"]:
            first[key] = row
    equivalent = load_equivalent()
    counts = {"mutants": 0, "equivalent": 0, "killed": 0}
    for row in first.values():
        if not since <= row["date"] < until:
            continue
        counts["mutants"] += 1
        if f"{row['module']}\t{row['col']}\t{row['label']}\t{row['source']}" in equivalent:
            counts["equivalent"] += 1
        elif row["status"] in ("killed", "timeout"):
            counts["killed"] += 1
    scored = counts["mutants"] - counts["equivalent"]
    return {
        **counts,
        "kill rate": counts["killed"] / scored if scored else None,
        "interval": wilson(counts["killed"], scored),
    }


def _append(row: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "results.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def mutate_module(
    module: str, results: dict[tuple[str, int, str], dict[str, Any]], sample: int | None, survivors_only: bool = False
) -> None:
    """Run every mutant of ``module`` that has no result for its current source and tests yet.

    A survivor whose tests changed runs again (unless it is listed as equivalent); ``sample`` draws that many of
    the mutants never run, under this source or an earlier one (same line text, column and mutation: a twin on a line
    that only moved is not fresh; seeded by the module's source), ``survivors_only`` runs none of those."""
    tests = MODULES[module]
    source_sha = digest([SRC / module.partition("::")[0]])
    tests_sha = digest([ROOT / t for t in (*tests, CONFTEST)])
    sites = sites_of(module)
    again, fresh = [], []
    equivalent = load_equivalent()
    for site in sites:
        old = results.get((module, site.index, source_sha))
        if old is None:
            fresh.append(site)
        elif (
            old["status"] in ("survived", "no coverage")
            and old["tests_sha"] != tests_sha
            and site.key not in equivalent
        ):
            again.append(site)  # a survivor the tests may now kill (an equivalent one survives any test)
    if survivors_only:
        fresh = []
    elif sample is not None:  # a seeded random sample of the mutants never run, under this source or an earlier one
        seen = {f"{r['module']}\t{r['col']}\t{r['label']}\t{r['source']}" for r in results.values()}
        fresh = [site for site in fresh if site.key not in seen]  # a twin on a moved line is not a fresh mutant
        if sample < len(fresh):
            chosen = set(random.Random(f"{module}:{source_sha}").sample(range(len(fresh)), sample))
            fresh = [site for i, site in enumerate(fresh) if i in chosen]
    todo = sorted([*again, *fresh], key=lambda site: site.index)
    print(f"{module}: {len(sites)} mutants, {len(todo)} to run", flush=True)
    if not todo:
        return
    trace = OUT / "coverage.tmp.json"
    OUT.mkdir(parents=True, exist_ok=True)
    status, traced, rc = run_forked(module, mutated_code(module, None), tests, 3600, trace, OUT / "baseline.log")
    if status != "pass":
        raise SystemExit(f"{module}: the unmutated tests do not pass (exit {rc}): see {OUT / 'baseline.log'}")
    coverage = json.loads(trace.read_text())
    trace.unlink()
    lines = {test: set(found) for test, found in coverage["lines"].items()}
    seconds = coverage["seconds"]
    print(f"  unmutated tests (traced): {traced:.1f} s, {len(seconds)} tests", flush=True)
    for n, site in enumerate(todo, 1):
        row = {
            **asdict(site),
            "source_sha": source_sha,
            "tests_sha": tests_sha,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        span = set(range(site.line, site.end_line + 1))
        # the tests that execute the mutated lines, fastest first; a line run at import: every test
        if span & lines.get("<collect>", set()):
            selected = tuple(sorted(seconds, key=seconds.get))
        else:
            selected = tuple(sorted((t for t in seconds if span & lines.get(t, set())), key=seconds.get))
        if not selected:
            row.update(status="no coverage", seconds=0.0)
        else:
            try:
                code = mutated_code(module, site.index)
            except (SyntaxError, ValueError, TypeError) as err:  # e.g. a constant the compiler refuses
                row.update(status="killed", seconds=0.0, note=f"does not compile: {err}")
            else:
                limit = 15 + 2 * sum(seconds[t] for t in selected)
                status, took, rc = run_forked(module, code, selected, limit)
                if rc in (4, 5):  # a test id pytest cannot select again: run the whole files instead
                    limit = 15 + 2 * sum(seconds.values())
                    status, took, rc = run_forked(module, code, tests, limit)
                row.update(
                    status={"pass": "survived", "fail": "killed", "timeout": "timeout"}[status],
                    seconds=round(took, 2),
                    exit_code=rc,
                    tests=len(selected),
                )
        _append(row)
        results[(module, site.index, source_sha)] = row
        print(f"  [{n}/{len(todo)}] {row['status']:11s} {site.line}:{site.col} {site.label}", flush=True)


RATES = ("kill rate", "interval")


def wilson(killed: int, scored: int, z: float = 1.959963984540054) -> tuple[float, float] | None:
    """The 95% Wilson score interval of a kill rate of ``killed`` of ``scored`` (None when nothing was scored): a
    module run on a sample of its mutants estimates its rate, with this uncertainty."""
    if scored <= 0:
        return None
    rate = killed / scored
    centre = (rate + z * z / (2 * scored)) / (1 + z * z / scored)
    half = z * math.sqrt(rate * (1 - rate) / scored + z * z / (4 * scored * scored)) / (1 + z * z / scored)
    return (round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4))


def summarize(modules: list[str]) -> dict[str, Any]:
    """Counts per module and overall from the results of each module's current source; writes the summary files."""
    results = load_results()
    equivalent = load_equivalent()
    used: set[str] = set()
    table: dict[str, dict[str, Any]] = {}
    survivors: list[str] = []
    for module in modules:
        source_sha = digest([SRC / module.partition("::")[0]])
        counts = dict.fromkeys(("mutants", "killed", "timeout", "survived", "no coverage", "equivalent", "not run"), 0)
        for site in sites_of(module):
            counts["mutants"] += 1
            row = results.get((module, site.index, source_sha))
            if row is None:
                counts["not run"] += 1
                continue
            status = row["status"]
            if status in ("survived", "no coverage") and site.key in equivalent:
                used.add(site.key)
                counts["equivalent"] += 1
                continue
            counts[status] += 1
            if status in ("survived", "no coverage"):
                survivors.append(f"{module}:{site.line}:{site.col}\t{status}\t{site.label}\t{site.source}")
        ran = counts["mutants"] - counts["not run"]
        scored = ran - counts["equivalent"]
        counts["kill rate"] = round((counts["killed"] + counts["timeout"]) / scored, 4) if scored else None
        counts["interval"] = wilson(counts["killed"] + counts["timeout"], scored)
        table[module] = counts
    total = {k: sum(t[k] for t in table.values()) for k in next(iter(table.values())) if k not in RATES}
    scored = total["mutants"] - total["not run"] - total["equivalent"]
    total["kill rate"] = round((total["killed"] + total["timeout"]) / scored, 4) if scored else None
    total["interval"] = wilson(total["killed"] + total["timeout"], scored)
    # modules run on a sample weigh by their number of mutants, not by how many of them ran
    rated = [t for t in table.values() if t["kill rate"] is not None]
    weight = sum(t["mutants"] for t in rated)
    stratified = sum(t["mutants"] * t["kill rate"] for t in rated) / weight if weight else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    summary = {
        "command": "PYTHONPATH=src nice -n 10 python benchmarks/mutation.py",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit.stdout.strip(),
        "operators": list(OPERATORS),
        "kill rate": "(killed + timeout) / (mutants - not run - equivalent)",
        "modules": table,
        "total": total,
        "kill rate weighted by module size": None if stratified is None else round(stratified, 4),
        "stale equivalent entries": sorted(set(equivalent) - used) if len(modules) == len(MODULES) else [],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    columns = ("mutants", "killed", "timeout", "survived", "no coverage", "equivalent", "not run", "kill rate")
    lines = ["module".ljust(52) + "".join(c.rjust(12) for c in columns) + "  95% interval".rjust(18)]
    for name, counts in [*table.items(), ("total", total)]:
        cells = [f"{counts[c]:.1%}" if c == "kill rate" and counts[c] is not None else str(counts[c]) for c in columns]
        low_high = counts["interval"]
        band = "" if low_high is None else f"[{low_high[0]:.1%}, {low_high[1]:.1%}]"
        lines.append(name.ljust(52) + "".join(c.rjust(12) for c in cells) + band.rjust(18))
    if stratified is not None:
        lines.append(f"kill rate with each module weighted by its number of mutants: {stratified:.1%}")
    (OUT / "summary.txt").write_text("\n".join(lines) + "\n")
    (OUT / "survivors.txt").write_text("\n".join(survivors) + ("\n" if survivors else ""))
    print("\n".join(lines))
    return summary


def preload() -> None:
    """Import the heavy third-party packages once, before forking (never ripplekv, which each child imports)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import transformers

    for cls in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Gemma3ForCausalLM"):
        getattr(transformers, cls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--module", action="append", default=[], help="modules whose path has this (repeatable, run in order)"
    )
    parser.add_argument("--sample", type=int, default=None, help="run a seeded random sample of this many per module")
    parser.add_argument(
        "--survivors-only", action="store_true", help="rerun only survivors whose tests changed (no new mutants)"
    )
    parser.add_argument("--summary", action="store_true", help="only write the summary of the results so far")
    parser.add_argument("--list", action="store_true", help="print the mutants of the selected modules")
    parser.add_argument(
        "--first-run", nargs=2, metavar=("SINCE", "UNTIL"), help="first-run kill rate of mutants first run then (ISO)"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(ROOT))
    # in the order of the --module arguments (each module once), else in the order of MODULES
    modules = list(MODULES) if not args.module else [m for s in args.module for m in MODULES if s in m]
    modules = list(dict.fromkeys(modules))
    if args.list:
        for module in modules:
            for site in sites_of(module):
                print(f"{module}:{site.line}:{site.col}\t{site.label}\t{site.source}")
        return
    if args.first_run:
        print(json.dumps(first_runs(*args.first_run)))
        return
    if not args.summary:
        preload()
        results = load_results()
        for module in modules:
            mutate_module(module, results, args.sample, args.survivors_only)
    summarize(list(MODULES))


if __name__ == "__main__":
    main()
