"""The library's commands in a library-only install (``pip install -e .``, no ``eval`` extra): the harness's
dependencies are made unimportable in a fresh interpreter (one for every call: the CLI is run as ``main(argv)``
there), as they are when the extra is not installed.

``.ci/run`` also runs the README's first command in a real library-only environment; these tests pin the mechanism
(the parser lists every command, a library command runs, a harness command exits 2 with its install line)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json"

# what a library-only install lacks: the eval extra's modules (and Ray, the ray extra)
BLOCKED = ("scipy", "rouge", "ray")
ALLOCATE = ("allocate", "--profile", str(PROFILE), "--budget", "0.1", "--prompt-tokens", "1024")
HARNESS = (("eval", "--suite", "needle", "--out", "x"), ("report", "runs/x"), ("tune", "--help"))
CALLS: tuple[tuple[str, ...], ...] = (("--help",), ALLOCATE, (*ALLOCATE, "--bogus"), *HARNESS)

# ``ripplekv argv`` for each argv of the JSON list in argv[1], in one interpreter: (exit code, stdout, stderr) each
RUN_ALL = """
import contextlib, io, json, sys
for blocked in json.loads(sys.argv[2]):
    sys.modules[blocked] = None
from ripplekv.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, ...], tuple[int, str, str]]:
    """Every call of :data:`CALLS` in one fresh interpreter whose harness dependencies cannot be imported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", RUN_ALL, json.dumps(CALLS), json.dumps(BLOCKED)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
    )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {argv: (code, out, err) for argv, (code, out, err) in zip(CALLS, results, strict=True)}


def test_help_lists_every_command_without_the_harness_extra(runs) -> None:
    code, out, err = runs[("--help",)]
    assert code == 0, err
    for name in ("profile", "allocate", "generate", "demo"):
        assert f"    {name} " in out
    for name in ("eval", "report", "analyze", "tune"):
        assert f"    {name}" in out and "not installed: pip install 'ripplekv[eval]'" in out


def test_a_library_command_runs_without_the_harness_extra(runs) -> None:
    code, out, err = runs[ALLOCATE]
    assert code == 0, err
    assert "30 layers, budget 0.1 of 1024 prompt tokens" in out


def test_a_library_command_still_refuses_unknown_options(runs) -> None:
    code, _, err = runs[(*ALLOCATE, "--bogus")]
    assert code == 2 and "unrecognized arguments: --bogus" in err


def test_a_harness_command_says_what_to_install(runs) -> None:
    for argv in HARNESS:
        code, _, err = runs[argv]
        assert code == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: ripplekv {argv[0]} needs "), err
        assert lines[0].endswith("pip install 'ripplekv[eval]'"), err


def test_install_hint_names_the_extra_that_requires_the_module() -> None:
    from ripplekv.cli.main import install_hint

    assert install_hint("scipy") == "pip install 'ripplekv[eval]'"
    assert install_hint("scipy.stats") == "pip install 'ripplekv[eval]'"
    assert install_hint("rouge") == "pip install 'ripplekv[eval]'"
    assert install_hint("ray") == "pip install 'ripplekv[ray]'"
    assert install_hint("surely_no_such_module") == "pip install surely_no_such_module"
    # a module of ripplekv's own packages is not a dependency (the test extra requires ripplekv itself)
    assert "[test]" not in install_hint("ripplekv.presses.no_such_module")
    assert install_hint("ripplekv_eval.no_such_module").endswith("pip install --force-reinstall ripplekv")


def test_the_harness_commands_import_exactly_the_eval_extra() -> None:
    """``ripplekv_eval/cli/__init__.py`` imports the ``eval`` extra's modules, so a missing extra is found when a
    harness command is loaded; the list must follow ``pyproject.toml``."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["eval"]
    tree = ast.parse((ROOT / "src" / "ripplekv_eval" / "cli" / "__init__.py").read_text())
    imports = [node for node in tree.body if isinstance(node, ast.Import)]
    imported = {alias.name.partition(".")[0] for node in imports for alias in node.names}
    assert imported == {Requirement(line).name for line in extra}
