"""The library's commands in a library-only install (``pip install -e .``, no ``eval`` extra): the harness's
dependencies are made unimportable in a fresh interpreter, as they are when the extra is not installed.

``.ci/run`` also runs the README's first command in a real library-only environment; these tests pin the mechanism
(the parser lists every command, a library command runs, a harness command exits 2 with its install line)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "benchmarks" / "results" / "smollm2-135m.profile.json"

# what a library-only install lacks: the eval extra's modules (and Ray, the ray extra)
BLOCK = "import sys; [sys.modules.__setitem__(m, None) for m in ('scipy', 'rouge', 'ray')]; "


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``ripplekv argv`` in a fresh interpreter whose harness dependencies cannot be imported."""
    code = BLOCK + "from ripplekv.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT, env=env)


def test_help_lists_every_command_without_the_harness_extra() -> None:
    out = cli("--help")
    assert out.returncode == 0, out.stderr
    for name in ("profile", "allocate", "generate", "demo"):
        assert f"    {name} " in out.stdout
    for name in ("eval", "report", "analyze", "tune"):
        assert f"    {name}" in out.stdout and "not installed: pip install 'ripplekv[eval]'" in out.stdout


def test_a_library_command_runs_without_the_harness_extra() -> None:
    out = cli("allocate", "--profile", str(PROFILE), "--budget", "0.1", "--prompt-tokens", "1024")
    assert out.returncode == 0, out.stderr
    assert "30 layers, budget 0.1 of 1024 prompt tokens" in out.stdout


def test_a_library_command_still_refuses_unknown_options() -> None:
    out = cli("allocate", "--profile", str(PROFILE), "--budget", "0.1", "--prompt-tokens", "1024", "--bogus")
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr


def test_a_harness_command_says_what_to_install() -> None:
    for argv in (("eval", "--suite", "needle", "--out", "x"), ("report", "runs/x"), ("tune", "--help")):
        out = cli(*argv)
        assert out.returncode == 2, (argv, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: ripplekv {argv[0]} needs "), out.stderr
        assert lines[0].endswith("pip install 'ripplekv[eval]'"), out.stderr


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
