"""``ripplekv tune``: choose RippleKV's profile, r and gamma by fidelity on a calibration split (imported at start-up:
nothing heavy at the top)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ripplekv.cli.args import comma_list
from ripplekv_eval.cli.analyze import add_summary_args, add_teacher_forced_args, print_summary
from ripplekv_eval.cli.eval import eval_config


def _grid_value(text: str) -> float:
    """An argparse ``type``: a grid value of r or gamma (a number >= 1)."""
    value = float(text)
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"r and gamma must be >= 1, got {text}")
    return value


def parse_profiles(items: list[str]) -> dict[str, str]:
    """``--profile`` values (``PATH`` or ``LABEL=PATH``) as label -> path, in order (default label: the file stem)."""
    profiles: dict[str, str] = {}
    for item in items:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).name.removesuffix(".json").removesuffix(".profile"), item
        if not label or not path:
            raise ValueError(f"--profile takes PATH or LABEL=PATH, got {item!r}")
        if label in profiles:
            raise ValueError(f"two profiles are labelled {label!r}: give LABEL=PATH to tell them apart")
        profiles[label] = path
    return profiles


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``tune`` subcommand to ``subparsers`` (the ``ripplekv`` command's); return its parser."""
    from ripplekv_eval.analysis.tuning import DEFAULT_GAMMAS, DEFAULT_RATIOS

    p = subparsers.add_parser(
        "tune",
        help="choose RippleKV's profile, r and gamma by fidelity on a calibration split (resumable)",
        description="Prefill every prompt of the suite once and decode the full cache's greedy answer. At each "
        "budget, derive the RippleKV cache of every candidate (each --profile x --ratios x --gammas) from that "
        "prefill and teacher-force the answer: mean KL(full || candidate), as fidelity_kl in `ripplekv eval`. The "
        "candidate with the lowest KL on each task's first prompts (--calibration-fraction) is compared with the "
        "defaults (the first profile, r=4, gamma=3) and with SnapKV on the remaining, held-out prompts (paired "
        "bootstrap intervals, Wilcoxon). Rows go to OUT/tune.jsonl as they finish; the summary to OUT/tune.json; "
        "re-running the same command resumes.",
    )
    add_teacher_forced_args(p, "kept fractions to tune at (default 0.1,0.2,0.3 unless --tokens is given alone)")
    p.add_argument(
        "--profile",
        action="append",
        required=True,
        help="sensitivity profile JSON, as PATH or LABEL=PATH; repeat to compare profiles (the first is the "
        "defaults' profile)",
    )
    p.add_argument(
        "--ratios",
        type=comma_list(_grid_value, "ratios"),
        default=DEFAULT_RATIOS,
        help="grid of r (default " + ",".join(f"{r:g}" for r in DEFAULT_RATIOS) + "; 4 is always included)",
    )
    p.add_argument(
        "--gammas",
        type=comma_list(_grid_value, "gammas"),
        default=DEFAULT_GAMMAS,
        help="grid of gamma (default " + ",".join(f"{g:g}" for g in DEFAULT_GAMMAS) + "; 3 is always included)",
    )
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="METHOD:KEY=V1|V2,...",
        help="a rival's grid, scored next to RippleKV's on the same prompts, prefill, scorer and rule; repeat per "
        "method: 'cake:tau1=0.5|1|2,tau2=0.5|1|2', 'squeezeattention:p=0.2|0.381|0.625', "
        "'dynamickv:radio_max=2|5|10,window=8|64', 'pyramidkv:beta=5|10|20|40' (each method's defaults are always "
        "among its candidates; docs/cli.md lists the parameters)",
    )
    p.add_argument(
        "--scorer",
        default="snapkv",
        help="the token scorer of every candidate and of the uniform reference (default snapkv)",
    )
    p.add_argument(
        "--calibration-fraction",
        type=float,
        default=0.5,
        help="share of each task's prompts (its first ones) that selects; the rest are held out (default 0.5)",
    )
    add_summary_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv tune`` with parsed ``args``; prints the summary, returns the exit status."""
    from ripplekv_eval.analysis.runner import run_tune
    from ripplekv_eval.analysis.tuning import TuneConfig
    from ripplekv_eval.analysis.tuning_report import methods_markdown, tuning_markdown

    profiles = parse_profiles(args.profile)
    config = TuneConfig(
        eval_config(args, methods=("snapkv",), score="fidelity", profile=None),
        profiles,
        ratios=tuple(args.ratios),
        gammas=tuple(args.gammas),
        grids=tuple(args.grid),
        scorer=args.scorer,
        calibration_fraction=args.calibration_fraction,
        resamples=args.resamples,
        bootstrap_seed=args.bootstrap_seed,
    )
    result = run_tune(config, args.out, progress=not args.no_progress)
    print_summary(result, args.format, lambda s: tuning_markdown(s) + methods_markdown(s), "tuning", "tune.json")
    return 0
