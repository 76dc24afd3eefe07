"""The ``ripplekv`` command line: profile, allocate, generate, demo, and the commands plugins add through the
``ripplekv.commands`` entry points (the harness's eval, report, analyze, tune). Each command is a module with
``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points, packages_distributions
from typing import Any, Protocol

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ripplekv.cli import allocate, demo, generate, profile
from ripplekv.version import __version__

EXAMPLES = """examples:
  ripplekv demo
  ripplekv profile --model smollm2-135m --out smollm2.profile.json
  ripplekv allocate --profile smollm2.profile.json --budget 0.1 --prompt-tokens 4096 --plot budgets.png
  ripplekv generate --model smollm2-135m --method ripplekv --profile smollm2.profile.json \\
      --budget 0.2 --context-file report.txt --question "Who signed the report?"
  ripplekv eval --suite needle --methods full,snapkv,pyramidkv,ripplekv --budgets 0.1,0.2,0.3 \\
      --profile smollm2.profile.json --out runs/needle
  ripplekv eval --suite ruler --methods full,snapkv,ripplekv --profile smollm2.profile.json \\
      --workers 4 --out runs/ruler
  ripplekv report runs/needle --plots runs/needle/plots
  ripplekv analyze --suite needle --budgets 0.1 --profile smollm2.profile.json --out runs/damage
  ripplekv eval --suite needle --methods full,snapkv,ripplekv-oracle --budgets 0.1 \\
      --oracle-profile runs/damage/damage_profile_b0p1.json --out runs/oracle
  ripplekv tune --suite needle --profile smollm2.profile.json --out runs/tune
"""

ENTRY_POINT_GROUP = "ripplekv.commands"
"""Entry points of this group name command modules that other packages add (the evaluation harness's four)."""


class Command(Protocol):
    """A ``ripplekv`` command: a module (or object) with ``add_parser(subparsers)`` and ``run(args) -> int``."""

    def add_parser(self, subparsers: Any) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace) -> int: ...


def install_hint(module: str | None, dist: str = "ripplekv") -> str:
    """The pip command that installs ``module``: the extra of ``dist`` that requires it, else the module itself; a
    module of ``dist``'s own packages is no dependency: ``dist`` itself is incomplete and is installed again.

    Args:
        module: the missing module (``ModuleNotFoundError.name``).
        dist: the distribution whose extras are searched.
    """
    top = (module or "").partition(".")[0]
    if dist in packages_distributions().get(top, ()):
        return f"{module} is part of {dist}, whose installation is incomplete: pip install --force-reinstall {dist}"
    name = canonicalize_name(top)
    try:
        requires = distribution(dist).requires or []
    except PackageNotFoundError:
        requires = []
    for line in requires:
        requirement = Requirement(line)
        marker = str(requirement.marker or "")
        extra = marker.partition('extra == "')[2].partition('"')[0]
        if extra and canonicalize_name(requirement.name) == name:
            return f"pip install '{dist}[{extra}]'"
    return f"pip install {module}"


@dataclass(frozen=True)
class UninstalledCommand:
    """A plugin command whose module cannot be imported (a missing extra): listed and parsed with any arguments, it
    exits 2 with the install line instead of a traceback, and the other commands still run."""

    name: str
    missing: str
    install: str

    def add_parser(self, subparsers: Any) -> argparse.ArgumentParser:
        """A parser that takes any arguments (they are never read)."""
        parser = subparsers.add_parser(self.name, help=f"not installed: {self.install}", add_help=False)
        parser.set_defaults(any_arguments=True)
        return parser

    def run(self, args: argparse.Namespace) -> int:
        """Print what to install; exit status 2."""
        print(
            f"error: ripplekv {self.name} needs {self.missing}, which is not installed: {self.install}", file=sys.stderr
        )
        return 2


def load_command(point: EntryPoint) -> Command:
    """The command module an entry point names, or an :class:`UninstalledCommand` when it cannot be imported (a
    plugin's command module imports its extra's modules, so a missing extra is found before anything runs)."""
    try:
        return point.load()
    except ModuleNotFoundError as err:
        dist = point.dist.name if point.dist is not None else "ripplekv"
        return UninstalledCommand(point.name, repr(err.name), install_hint(err.name, dist))


def commands(names: Sequence[str] | None = None) -> dict[str, Command]:
    """The commands by name, the library's first, then installed plugins' (a plugin is imported only when named or
    when ``names`` is None; one whose dependencies are missing is an :class:`UninstalledCommand`)."""
    found: dict[str, Command] = {"profile": profile, "allocate": allocate, "generate": generate, "demo": demo}
    wanted = None if names is None else set(names)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name not in found and (wanted is None or point.name in wanted):
            found[point.name] = load_command(point)
    return found if wanted is None else {name: command for name, command in found.items() if name in wanted}


JSON_ONLY_COMMANDS = frozenset({"report"})
"""Commands that read JSON files only and run without importing torch, transformers or kvpress (tested): :func:`main`
parses them without the other commands' parsers and leaves transformers' logging alone."""


def build_parser(names: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``ripplekv`` argument parser, with every command of :func:`commands` (or only ``names``)."""
    parser = argparse.ArgumentParser(
        prog="ripplekv",
        description="RippleKV: per-layer KV-cache budgets from downstream sensitivity profiling.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ripplekv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in commands(names).values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ripplekv`` command line on ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    from ripplekv.distributed import WorkerLostError
    from ripplekv.profiling.haystack import EssayCorpusMissingError

    argv = sys.argv[1:] if argv is None else list(argv)
    # a JSON-only command parses with its own parser alone: the other commands' options (their choices and
    # defaults) import torch, transformers and kvpress
    parser = build_parser([argv[0]] if argv and argv[0] in JSON_ONLY_COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command not in JSON_ONLY_COMMANDS:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # the CLI prints its own progress; silence weight-loading bars and warnings
        hf_logging.disable_progress_bar()
    try:
        return commands([args.command])[args.command].run(args)
    except ModuleNotFoundError as err:  # a dependency a command imports only when it runs
        print(f"error: {err}: {install_hint(err.name)}", file=sys.stderr)
        return 2
    except (ValueError, OSError, ImportError, EssayCorpusMissingError, WorkerLostError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
