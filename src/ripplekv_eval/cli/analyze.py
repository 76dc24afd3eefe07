"""``ripplekv analyze``: per-layer damage on a suite's prompts against a profile (imported at start-up: nothing heavy
at the top)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ripplekv.cli.args import positive_int
from ripplekv_eval.cli.eval import add_suite_args, eval_config

if TYPE_CHECKING:
    from ripplekv_eval.running.results import RunResult


DEFAULT_ANSWER_TOKENS = 32  # analyze's and tune's default cap on the answer teacher-forced


def add_teacher_forced_args(parser: argparse.ArgumentParser, budgets_help: str) -> None:
    """Add :func:`add_suite_args`'s options, the answer cap being that of the teacher-forced answer."""
    add_suite_args(
        parser,
        budgets_help,
        DEFAULT_ANSWER_TOKENS,
        f"cap on the full cache's answer that is teacher-forced (default {DEFAULT_ANSWER_TOKENS})",
    )


def add_summary_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--resamples``, ``--bootstrap-seed``, ``--format`` (``analyze`` and ``tune`` print paired statistics),
    ``--no-progress`` and ``--out``."""
    from ripplekv_eval.reporting.stats import DEFAULT_RESAMPLES

    parser.add_argument(
        "--resamples",
        type=positive_int,
        default=DEFAULT_RESAMPLES,
        help=f"bootstrap resamples (default {DEFAULT_RESAMPLES}, at least 2000)",
    )
    parser.add_argument("--bootstrap-seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--format", choices=("md", "json"), default="md", help="summary printed: md (default) or json")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--out", required=True, help="output folder (resumed when it holds the same run)")


def print_summary(
    result: RunResult, fmt: str, markdown: Callable[[Mapping[str, Any]], str], rows: str, file: str
) -> None:
    """Print ``result``'s summary as JSON or ``markdown`` of it, and on stderr what the run's ``rows`` file holds."""
    print(json.dumps(result.summary, indent=2) + "\n" if fmt == "json" else markdown(result.summary), end="")
    print(
        f"{result.rows} {rows} rows ({result.new_rows} new) for {result.samples} prompts in {result.out} "
        f"({result.seconds:.1f} s); summary {result.out / file}",
        file=sys.stderr,
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``analyze`` subcommand to ``subparsers`` (the ``ripplekv`` command's); return its parser."""
    from ripplekv_eval.analysis.runner import DEFAULT_TOP_K

    p = subparsers.add_parser(
        "analyze",
        help="per-layer damage (one layer compressed alone) on a suite's prompts, against a profile (resumable)",
        description="Prefill every prompt of the suite once and decode the full cache's greedy answer. For each "
        "budget and layer, compress that layer alone (SnapKV; every other layer full; derived from the one prefill) "
        "and teacher-force the answer: the layer's damage is the mean KL(full || that cache), as fidelity_kl in "
        "`ripplekv eval`. Reports Spearman rho of the mean damage per layer with the profile's KL and local scores, "
        "depth (rho > 0: deeper layers do more damage) and PyramidKV's budgets, with 95% bootstrap intervals over "
        "prompts, per-prompt rhos and top-k overlaps; writes OUT/analysis.json, plots, and a damage profile per "
        "budget (OUT/damage_profile_b<budget>.json) for `ripplekv eval --methods ripplekv-oracle --oracle-profile`. "
        "Rows go to OUT/damage.jsonl as they finish; re-running the same command resumes.",
    )
    add_teacher_forced_args(
        p, "kept fractions the one layer is compressed to (default 0.1,0.2,0.3 unless --tokens is given alone)"
    )
    p.add_argument("--profile", default=None, help="sensitivity profile JSON to compare (omitted: depth and pyramid)")
    p.add_argument(
        "--top-k", type=positive_int, default=DEFAULT_TOP_K, help=f"top layers compared (default {DEFAULT_TOP_K})"
    )
    p.add_argument("--no-plots", action="store_true", help="do not write OUT/plots")
    add_summary_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv analyze`` with parsed ``args``; prints the summary, returns the exit status."""
    from ripplekv_eval.analysis.report import to_markdown
    from ripplekv_eval.analysis.runner import AnalysisConfig, run_analysis

    evaluation = eval_config(args, methods=("snapkv",), score="fidelity")
    config = AnalysisConfig(
        evaluation,
        top_k=args.top_k,
        resamples=args.resamples,
        bootstrap_seed=args.bootstrap_seed,
        plots=not args.no_plots,
    )
    result = run_analysis(config, args.out, progress=not args.no_progress)
    print_summary(result, args.format, to_markdown, "damage", "analysis.json")
    return 0
