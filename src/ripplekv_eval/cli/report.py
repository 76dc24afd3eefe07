"""``ripplekv report``: tables, statistics and plots of an eval folder."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` subcommand to ``subparsers`` (the ``ripplekv`` command's); return its parser."""
    r = subparsers.add_parser(
        "report",
        help="tables, statistics and plots of an eval folder",
        description="Per-task and average tables (rows methods, columns budgets, each cell the score and its "
        "percentage of the full cache); for the score and each fidelity metric, 95% stratified BCa bootstrap "
        "intervals of the means, paired differences to SnapKV and to the best other method (stratified sign-flip "
        "permutation test of the macro-mean difference, the interval inverting it, Holm over the --family) and one "
        "significance line per budget; and plots. The report names the test and the family it used.",
    )
    r.add_argument("run", help="an eval output folder")
    r.add_argument(
        "--format",
        choices=("md", "csv", "json"),
        default="md",
        help="md: tables and statistics (default); csv: score tables; json: everything",
    )
    r.add_argument("--plots", default=None, help="folder for PNG plots")
    r.add_argument(
        "--metrics",
        default=None,
        help="comma-separated metrics for the statistics: score, fidelity_kl, top1_agreement, gold_nll_delta "
        "(default: every one the results hold)",
    )
    r.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the sign-flip test (default 0)")
    r.add_argument("--resamples", type=int, default=None, help="bootstrap resamples (default 4000, at least 2000)")
    r.add_argument(
        "--permutations",
        type=int,
        default=None,
        help="random sign vectors per comparison beyond 16 samples (default 19999, at least 999)",
    )
    r.add_argument(
        "--family",
        choices=("budget", "metric"),
        default="budget",
        help="Holm's family: the comparisons of one metric at one budget (default) or over all budgets",
    )
    return r


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv report`` with parsed ``args``: print the report; return the exit status."""
    from ripplekv_eval.reporting.report import report
    from ripplekv_eval.reporting.stats import DEFAULT_DRAWS, DEFAULT_RESAMPLES, FAMILIES, TEST_NAME

    metrics = None if args.metrics is None else [m.strip() for m in args.metrics.split(",") if m.strip()]
    resamples = DEFAULT_RESAMPLES if args.resamples is None else args.resamples
    draws = DEFAULT_DRAWS if args.permutations is None else args.permutations
    print(report(args.run, args.format, args.plots, metrics, args.seed, resamples, draws, args.family), end="")
    if args.format != "csv":
        print(f"significance: {TEST_NAME}; Holm over {FAMILIES[args.family]}", file=sys.stderr)
    if args.plots:
        print(f"plots saved to {args.plots}", file=sys.stderr)
    return 0
