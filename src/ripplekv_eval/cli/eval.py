"""``ripplekv eval`` (in this process or sharded over Ray actors) and the suite options ``analyze`` and ``tune`` take
as ``eval`` does (:func:`add_suite_args`, :func:`eval_config`); imported at start-up: nothing heavy at the top."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from ripplekv.cli.args import (  # memory_size: imported by name from here too
    add_model_args,
    add_ray_args,
    budget_arg,
    comma_list,
    memory_size,
    method_list,
    on_ray,
    positive_int,
    prefill_chunk_arg,
    resolve_budgets,
    row_tokens_arg,
)

if TYPE_CHECKING:
    from ripplekv_eval.running.config import EvalConfig


def add_suite_args(p: argparse.ArgumentParser, budgets_help: str, max_new_tokens: int | None, answer_help: str) -> None:
    """Add the model, the suite and its options, the budgets and the answer cap (``--max-new-tokens``)."""
    from ripplekv.inference.generate import PROTOCOLS
    from ripplekv.presses.registry import DEFAULT_WINDOW
    from ripplekv_eval.running.config import CHAT_TEMPLATE_MODES
    from ripplekv_eval.suites import (
        DEFAULT_CONTEXT_TOKENS,
        DEFAULT_JSONL_METRIC,
        DEFAULT_NEEDLE_DIGITS,
        DEFAULT_RULER_SAMPLES,
        SUITES,
    )
    from ripplekv_eval.tasks.metrics import METRICS

    add_model_args(p)
    p.add_argument(
        "--suite",
        choices=tuple(SUITES),
        required=True,
        help="; ".join(f"{name}: {suite.description}" for name, suite in SUITES.items()),
    )
    p.add_argument("--data-dir", default=None, help="longbench: folder of official <task>.jsonl files")
    p.add_argument(
        "--data", default=None, help='jsonl: a file of {"context", "question", "answers"} records, one a line'
    )
    p.add_argument(
        "--metric",
        choices=tuple(METRICS),
        default=None,
        help=f"jsonl: the LongBench metric scoring each answer (default {DEFAULT_JSONL_METRIC})",
    )
    p.add_argument("--budgets", type=comma_list(budget_arg, "budgets"), default=None, help=budgets_help)
    p.add_argument(
        "--tokens",
        type=comma_list(row_tokens_arg, "token counts"),
        default=None,
        help="comma-separated average tokens kept per layer (each >= 2), run besides --budgets; rows record them in "
        "their budget column as whole numbers (a budget above 1 is a token count); not for kvpress's own presses "
        "(streamingllm, adakv, pyramidkv-kvpress)",
    )
    p.add_argument("--tasks", type=comma_list(str, "tasks"), default=None, help="comma-separated (default all)")
    p.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help="samples per task: longbench and jsonl the first N records (default all), ruler N per task (default "
        f"{DEFAULT_RULER_SAMPLES}), needle N seeds per (length, depth) (default 1)",
    )
    p.add_argument(
        "--chat-template",
        choices=CHAT_TEMPLATE_MODES,
        default="auto",
        help="auto (default): longbench as pred.py does (the chat template except for trec, triviaqa, samsum, "
        "lsht, lcc, repobench-p), the other suites whenever the tokenizer has one; on: always; off: plain prompts",
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="question-aware", help="default question-aware")
    p.add_argument(
        "--context-tokens",
        type=positive_int,
        default=None,
        help=f"ruler: context length (default {DEFAULT_CONTEXT_TOKENS})",
    )
    p.add_argument("--skip", type=int, default=None, help="longbench: records skipped at the start of each task file")
    p.add_argument(
        "--max-length", type=positive_int, default=None, help="longbench: truncation (default: model max positions)"
    )
    p.add_argument(
        "--needle-lengths",
        type=comma_list(positive_int, "lengths"),
        default=None,
        help="needle: context lengths in tokens (default 1024,2048,4096)",
    )
    p.add_argument(
        "--needle-depths",
        type=comma_list(float, "depths"),
        default=None,
        help="needle: depths in [0, 1] (default 0,0.25,0.5,0.75,1)",
    )
    p.add_argument(
        "--needle-digits",
        type=positive_int,
        default=None,
        help=f"needle: digits of the number (default {DEFAULT_NEEDLE_DIGITS})",
    )
    p.add_argument("--window-size", type=positive_int, default=DEFAULT_WINDOW, help="SnapKV window (default 64)")
    p.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens, help=answer_help)
    p.add_argument("--seed", type=int, default=0, help="RULER and needle seed (default 0)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``eval`` subcommand to ``subparsers`` (the ``ripplekv`` command's); return its parser."""
    from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK
    from ripplekv.presses.registry import METHODS, METHODS_WITHOUT_SCORER
    from ripplekv.presses.scorers import DEFAULT_SCORER, SCORERS
    from ripplekv_eval.running.config import DECODE_MODES, DEFAULT_METHODS, SCORE_MODES
    from ripplekv_eval.suites import JSONL_MAX_NEW_TOKENS

    e = subparsers.add_parser(
        "eval",
        help="score methods x budgets on LongBench, the RULER-style suite, needle prompts or a JSONL file (resumable)",
        description="Prefill every sample once and derive every (method, budget) cache from that prefill. The full "
        "cache's greedy answer is the reference: every configuration records its fidelity to it (mean KL, top-1 "
        "agreement) and the NLL of the gold answer; with --score both (default) every configuration is also "
        "decoded greedily and scored. Rows go to OUT/results.jsonl as they finish; re-running the same command "
        "resumes.",
    )
    add_suite_args(
        e,
        "comma-separated kept fractions in (0, 1] (default 0.1,0.2,0.3 unless --tokens is given alone); full always "
        "runs once at 1.0",
        None,
        f"cap on every task's answer length (jsonl: the answer length, default {JSONL_MAX_NEW_TOKENS})",
    )
    e.add_argument(
        "--methods",
        type=method_list,
        default=DEFAULT_METHODS,
        help=f"comma-separated, from {', '.join(METHODS)} (default {','.join(DEFAULT_METHODS)}); a method "
        "takes its parameters after a colon, key=value items continuing it: "
        "'full,ripplekv:r=16,gamma=12,cake:tau1=2,tau2=0.5,squeezeattention:p=0.625' (docs/cli.md lists each "
        "method's parameters)",
    )
    e.add_argument(
        "--scorers",
        type=comma_list(str, "scorers"),
        default=(DEFAULT_SCORER,),
        help=f"comma-separated token scorers, from {', '.join(SCORERS)} (default {DEFAULT_SCORER}): every method "
        "built on a scorer runs under each (rows record method and scorer; reports name it method@scorer, the "
        f"default scorer's plain); {', '.join(METHODS_WITHOUT_SCORER)} run once",
    )
    e.add_argument(
        "--score",
        choices=SCORE_MODES,
        default="both",
        help="both (default): decode and score every configuration and record its fidelity to the full cache; "
        "fidelity: decode and score the full cache only, the other configurations get fidelity alone (for large "
        "runs)",
    )
    e.add_argument(
        "--decode",
        choices=DECODE_MODES,
        default="batched",
        help="batched (default): a sample's compressed configurations decode as one batch (same greedy tokens "
        "up to float rounding at near-ties, several times faster); sequential: one at a time",
    )
    e.add_argument(
        "--decode-rows",
        type=positive_int,
        default=None,
        help="most configurations per decoding batch (default: as many as --decode-memory allows)",
    )
    e.add_argument(
        "--decode-memory",
        type=memory_size,
        default=None,
        help="most memory of caches held for one batched decode, e.g. 2GiB (default: one full cache of the "
        "sample): configurations are derived, scored and decoded in groups within it",
    )
    e.add_argument(
        "--prefill-chunk",
        type=prefill_chunk_arg,
        default=DEFAULT_PREFILL_CHUNK,
        help=f"most tokens per prefill pass (default {DEFAULT_PREFILL_CHUNK}; none: one pass): a longer prompt is "
        "prefilled in chunks over its growing cache, bounding the prefill's activations by the chunk (the same cache "
        "up to float rounding; prompts within the chunk run exactly as one pass)",
    )
    e.add_argument(
        "--profile",
        default=None,
        help="profile JSON (required by ripplekv methods; they run its chosen r and gamma unless the method's name "
        "gives them)",
    )
    e.add_argument(
        "--strict-profile",
        action="store_true",
        help="a profile measured on other weights than the model's (another weights fingerprint) is an error, "
        "not a warning",
    )
    e.add_argument(
        "--oracle-profile",
        type=comma_list(str, "oracle profiles"),
        default=None,
        help="ripplekv-oracle: damage profile(s) from `ripplekv analyze` (OUT/damage_profile_b<budget>.json), "
        "comma-separated: one is used at every budget, several are each used at the budget they were measured at",
    )
    e.add_argument("--out", required=True, help="output folder (resumed when it holds the same run)")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_ray_args(e, "samples")
    return e


def eval_config(args: argparse.Namespace, **fixed: Any) -> EvalConfig:
    """The :class:`~ripplekv_eval.running.config.EvalConfig` of parsed arguments (:func:`add_suite_args` and, for
    ``eval``, its own), ``fixed`` overriding them; ``benchmarks/reproduce_rows.py`` rebuilds committed runs with it."""
    from ripplekv_eval.running.config import DEFAULT_BUDGETS, EvalConfig
    from ripplekv_eval.suites import SUITES

    names = {f.name for suite in SUITES.values() for f in dataclasses.fields(suite.options_type)}
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(EvalConfig) if hasattr(args, f.name)}
    given.update(
        budgets=resolve_budgets(args, DEFAULT_BUDGETS),
        tokens=tuple(args.tokens or ()),
        options={name: getattr(args, name) for name in sorted(names) if getattr(args, name, None) is not None},
    )
    return EvalConfig(**{**given, **fixed})


def run(args: argparse.Namespace) -> int:
    """Run (or resume) ``ripplekv eval`` (on Ray with ``--workers N > 1`` or ``--ray-address``); return the status."""
    from ripplekv_eval.running.runner import run_eval

    config = eval_config(args)
    if on_ray(args):
        from ripplekv_eval.running.distributed import run_eval_ray

        summary = run_eval_ray(config, args.out, args.workers, args.ray_address, progress=not args.no_progress)
    else:
        summary = run_eval(config, args.out, progress=not args.no_progress)
    print(
        f"{summary.rows} results ({summary.new_rows} new) for {summary.samples} samples x "
        f"{summary.configurations} configurations in {summary.out} ({summary.seconds:.1f} s); "
        f"tables: ripplekv report {summary.out}"
    )
    return 0
