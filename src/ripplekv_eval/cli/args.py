"""Option groups of the harness's commands: a suite's prompts as ``analyze`` and ``tune`` take them, summaries."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ripplekv.cli.args import add_model_args, budget_arg, comma_list, positive_int, resolve_budgets, row_tokens_arg

if TYPE_CHECKING:
    from ripplekv_eval.running.config import EvalConfig

__all__ = ["add_fidelity_suite_args", "add_summary_args", "fidelity_eval_config", "suite_options"]


def suite_options(args: argparse.Namespace) -> dict[str, Any]:
    """Every suite's own options that were given on the command line (the chosen suite refuses others)."""
    import dataclasses

    from ripplekv_eval.suites import SUITES

    names = {f.name for suite in SUITES.values() for f in dataclasses.fields(suite.options_type)}
    return {name: getattr(args, name) for name in sorted(names) if getattr(args, name, None) is not None}


def add_fidelity_suite_args(parser: argparse.ArgumentParser, budgets_help: str) -> None:
    """Add the model, suite, suite options, budgets and answer cap of ``analyze`` and ``tune``.

    They take a suite's prompts as ``ripplekv eval`` does (:func:`fidelity_eval_config` reads the options back);
    ``budgets_help`` is the help text of ``--budgets``.
    """
    from ripplekv.inference import PROTOCOLS
    from ripplekv.presses.registry import DEFAULT_WINDOW
    from ripplekv_eval.analysis.runner import DEFAULT_ANSWER_TOKENS
    from ripplekv_eval.running import runner
    from ripplekv_eval.running.config import CHAT_TEMPLATE_MODES
    from ripplekv_eval.tasks.metrics import METRICS as EVAL_METRICS

    add_model_args(parser)
    p = parser
    p.add_argument("--suite", choices=tuple(runner.SUITES), required=True, help="the prompts, as for `ripplekv eval`")
    p.add_argument("--data-dir", default=None, help="longbench: folder of official <task>.jsonl files")
    p.add_argument("--data", default=None, help='jsonl: a file of {"context", "question", "answers"} records')
    p.add_argument("--metric", choices=tuple(EVAL_METRICS), default=None, help="jsonl: the records' metric")
    p.add_argument("--tasks", type=comma_list(str, "tasks"), default=None, help="comma-separated (default all)")
    p.add_argument("--limit", type=positive_int, default=None, help="samples per task, as for `ripplekv eval`")
    p.add_argument("--budgets", type=comma_list(budget_arg, "budgets"), default=None, help=budgets_help)
    p.add_argument(
        "--tokens",
        type=comma_list(row_tokens_arg, "token counts"),
        default=None,
        help="comma-separated average tokens kept per layer (each >= 2), run besides --budgets (alone when "
        "--budgets is not given)",
    )
    p.add_argument("--chat-template", choices=CHAT_TEMPLATE_MODES, default="auto", help="as for `ripplekv eval`")
    p.add_argument("--protocol", choices=PROTOCOLS, default="question-aware", help="default question-aware")
    p.add_argument("--context-tokens", type=positive_int, default=None, help="ruler: context length")
    p.add_argument("--skip", type=int, default=None, help="longbench: records skipped at the start of each task file")
    p.add_argument("--max-length", type=positive_int, default=None, help="longbench: truncation length")
    p.add_argument("--needle-lengths", type=comma_list(positive_int, "lengths"), default=None, help="needle")
    p.add_argument("--needle-depths", type=comma_list(float, "depths"), default=None, help="needle")
    p.add_argument("--needle-digits", type=positive_int, default=None, help="needle")
    p.add_argument("--window-size", type=positive_int, default=DEFAULT_WINDOW, help="SnapKV window (default 64)")
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=DEFAULT_ANSWER_TOKENS,
        help=f"cap on the full cache's answer that is teacher-forced (default {DEFAULT_ANSWER_TOKENS})",
    )
    p.add_argument("--seed", type=int, default=0, help="RULER and needle seed (default 0)")


def add_summary_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--resamples``, ``--bootstrap-seed`` and ``--format`` (commands printing paired statistics)."""
    from ripplekv_eval.reporting.stats import DEFAULT_RESAMPLES

    parser.add_argument(
        "--resamples",
        type=positive_int,
        default=DEFAULT_RESAMPLES,
        help=f"bootstrap resamples (default {DEFAULT_RESAMPLES}, at least 2000)",
    )
    parser.add_argument("--bootstrap-seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--format", choices=("md", "json"), default="md", help="summary printed: md (default) or json")


def fidelity_eval_config(args: argparse.Namespace, profile: str | None) -> EvalConfig:
    """The :class:`~ripplekv_eval.running.config.EvalConfig` of :func:`add_fidelity_suite_args`' options."""
    from ripplekv_eval.running.config import DEFAULT_BUDGETS, EvalConfig

    return EvalConfig(
        suite=args.suite,
        model=args.model,
        methods=("snapkv",),
        budgets=resolve_budgets(args, DEFAULT_BUDGETS),
        tokens=tuple(args.tokens or ()),
        tasks=args.tasks,
        limit=args.limit,
        profile=profile,
        protocol=args.protocol,
        window_size=args.window_size,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        score="fidelity",
        chat_template=args.chat_template,
        options=suite_options(args),
    )
