"""``ripplekv analyze``, and ``ripplekv eval``'s ``--oracle-profile`` option (:func:`add_oracle_profile_argument`).

Imported by :mod:`ripplekv.cli.main` at start-up, so nothing heavy is imported at the top.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ripplekv.cli.args import comma_list, positive_int
from ripplekv_eval.cli.args import add_fidelity_suite_args, add_summary_args, fidelity_eval_config

__all__ = ["add_oracle_profile_argument", "add_parser", "run"]


def add_oracle_profile_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--oracle-profile`` (comma-separated damage profile paths) to ``ripplekv eval``'s ``parser``."""
    parser.add_argument(
        "--oracle-profile",
        type=comma_list(str, "oracle profiles"),
        default=None,
        help="ripplekv-oracle: damage profile(s) from `ripplekv analyze` (OUT/damage_profile_b<budget>.json), "
        "comma-separated: one is used at every budget, several are each used at the budget they were measured at",
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
    add_fidelity_suite_args(
        p, "kept fractions the one layer is compressed to (default 0.1,0.2,0.3 unless --tokens is given alone)"
    )
    p.add_argument("--profile", default=None, help="sensitivity profile JSON to compare (omitted: depth and pyramid)")
    p.add_argument(
        "--top-k", type=positive_int, default=DEFAULT_TOP_K, help=f"top layers compared (default {DEFAULT_TOP_K})"
    )
    add_summary_args(p)
    p.add_argument("--no-plots", action="store_true", help="do not write OUT/plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", required=True, help="output folder (resumed when it holds the same run)")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv analyze`` with parsed ``args``; prints the summary, returns the exit status."""
    import sys

    from ripplekv_eval.analysis.report import to_markdown
    from ripplekv_eval.analysis.runner import AnalysisConfig, run_analysis

    evaluation = fidelity_eval_config(args, profile=args.profile)
    config = AnalysisConfig(
        evaluation,
        top_k=args.top_k,
        resamples=args.resamples,
        bootstrap_seed=args.bootstrap_seed,
        plots=not args.no_plots,
    )
    result = run_analysis(config, args.out, progress=not args.no_progress)
    if args.format == "json":
        print(json.dumps(result.summary, indent=2))
    else:
        print(to_markdown(result.summary), end="")
    print(
        f"{result.rows} damage rows ({result.new_rows} new) for {result.samples} prompts in {result.out} "
        f"({result.seconds:.1f} s); summary {result.out / 'analysis.json'}",
        file=sys.stderr,
    )
    return 0
