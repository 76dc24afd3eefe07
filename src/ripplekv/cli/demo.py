"""``ripplekv demo``: profile, allocate and answer a needle-in-a-haystack question with four methods."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ripplekv.cli.args import add_model_args, comma_list, fraction_arg, positive_int

if TYPE_CHECKING:  # imported where used: ``ripplekv report`` imports this module and no torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ripplekv.profiling.profile import SensitivityProfile
    from ripplekv.profiling.sensitivity import ProfilingConfig

DEMO_METHODS = ("full", "snapkv", "pyramidkv", "ripplekv")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to ``subparsers``; return its parser."""
    d = subparsers.add_parser(
        "demo",
        help="the main job on the default model: profile, allocate, answer a needle question",
        # a description is printed as is (only arguments' help strings are %-formatted): a single % sign
        description="Profile SmolLM2-135M (cached after the first run), allocate at 10% (and 50%), answer a "
        "needle-in-a-haystack question in real essay text with full, snapkv, pyramidkv and ripplekv, print "
        "a side-by-side table and save a plot of the profile and the budgets.",
    )
    add_model_args(d)
    d.add_argument(
        "--budgets",
        type=comma_list(fraction_arg, "budgets"),
        default="0.1,0.5",
        help="kept fractions, comma-separated (default 0.1,0.5; the first is plotted)",
    )
    d.add_argument("--digits", type=positive_int, default=4, help="digits of the needle's number (default 4)")
    d.add_argument("--context-tokens", type=positive_int, default=2048, help="haystack length (default 2048)")
    d.add_argument("--depth", type=float, default=0.5, help="needle depth in [0, 1] (default 0.5)")
    d.add_argument("--seed", type=int, default=0, help="needle seed (default 0)")
    d.add_argument("--out", default="ripplekv-demo", help="folder for the plot and results (default ripplekv-demo)")
    return d


def default_profile_path(model: PreTrainedModel, config: ProfilingConfig) -> Path:
    """Where :func:`cached_default_profile` keeps the profile of ``model`` (architecture, weights, scoring, config)."""
    from ripplekv.models.identity import model_identity, weights_fingerprint
    from ripplekv.models.sources import cache_root
    from ripplekv.profiling import sensitivity

    identity = model_identity(model)
    weights = weights_fingerprint(model).removeprefix("sha256:")[:16]
    name = (
        f"{identity['config_hash'][:16]}-w{weights}-v{sensitivity.SCORING_VERSION}-default"
        f"-a{config.alpha}-r{config.repeats}-s{config.seed}.json"
    )
    return cache_root() / "profiles" / name


def cached_default_profile(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: ProfilingConfig | None = None
) -> SensitivityProfile:
    """The model's profile on the default calibration set, measured once and cached under RIPPLEKV_CACHE.

    The cache file is named by the architecture, the weights' fingerprint and the scoring version, so a
    profile measured on other weights of the same architecture, or by an older scoring, is never reused. The demo
    measures the sensitivity only (``ripplekv profile --no-select-setting``): choosing r and gamma costs a few times
    the sensitivity pass today, so its presses use the profile's setting when a cached profile has one, else the
    library's default (``ripplekv profile`` chooses a model's own).
    """
    from tqdm import tqdm

    from ripplekv.inference.setting import profile_with_setting
    from ripplekv.profiling.calibration import default_calibration
    from ripplekv.profiling.profile import SensitivityProfile, resolve_setting
    from ripplekv.profiling.sensitivity import ProfilingConfig

    config = config or ProfilingConfig()

    path = default_profile_path(model, config)
    if path.exists():
        print(f"profile: cached {path}")
        return SensitivityProfile.load(path)
    calibration = default_calibration(tokenizer, seed=config.seed)
    print(f"profile: measuring on {calibration.description} (first run only; cached in {path})")
    start = time.perf_counter()
    with tqdm(total=len(calibration), desc="profiling", unit="sample") as bar:

        def progress(done: int, total: int) -> None:
            bar.n = done
            bar.refresh()

        checkpoint = str(path.with_suffix(".partial.jsonl"))
        run = profile_with_setting(
            model, tokenizer, calibration, config, checkpoint=checkpoint, progress=progress, select=False
        )
    profile = run.profile
    profile.save(path)
    path.with_suffix(".partial.jsonl").unlink(missing_ok=True)
    print(f"profile: {time.perf_counter() - start:.0f} s; RippleKV setting {resolve_setting(profile).describe()}")
    return profile


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv demo``: print the table, save the plot and results; return the exit status."""
    from ripplekv.cli.plots import plot_profile_and_budgets
    from ripplekv.inference.generate import generate_answer
    from ripplekv.models.loading import load_model
    from ripplekv.presses.registry import make_press
    from ripplekv.profiling.haystack import build_needle_prompt
    from ripplekv.profiling.profile import resolve_setting

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
    profile = cached_default_profile(model, tokenizer)
    budgets = list(args.budgets)
    needle = build_needle_prompt(tokenizer, args.context_tokens, depth=args.depth, seed=args.seed, digits=args.digits)
    print(f"needle: {needle.needle!r} at depth {needle.depth:.0%} of {needle.context_tokens} tokens of essays")
    print(f"question: {needle.question}  (expected: {needle.answer})\n")

    rows = []
    for method, budget in [("full", 1.0)] + [(m, b) for b in budgets for m in DEMO_METHODS if m != "full"]:
        press = make_press(method, budget=budget, profile=profile)
        result = generate_answer(model, tokenizer, needle.context, needle.question, press, max_new_tokens=24)
        rows.append(
            {
                "method": method,
                "budget": budget,
                "answer": result.text,
                "correct": needle.retrieved(result.text),
                "kv_bytes": result.kv_bytes,
                "kv_fraction": result.kv_fraction,
                "seconds": result.prefill_seconds + result.decode_seconds,
                "layer_tokens": list(result.layer_tokens),
                "prompt_tokens": result.prompt_tokens,
            }
        )
        print(f"  {method:<10} {budget:>4g}  done in {rows[-1]['seconds']:.1f} s")

    print(f"\n{rows[0]['prompt_tokens']}-token prompt, {profile.num_layers} layers, question-aware compression")
    applied = resolve_setting(profile)
    print(f"ripplekv: {applied.describe()}\n")
    print(f"{'method':<10} {'budget':>6} {'correct':<7} {'KV MiB':>7} {'of full':>7} {'time s':>6}  answer")
    for row in rows:
        answer = row["answer"].replace("\n", " ")
        print(
            f"{row['method']:<10} {row['budget']:>6g} {'yes' if row['correct'] else 'no':<7} "
            f"{row['kv_bytes'] / 2**20:7.2f} {100 * row['kv_fraction']:6.1f}% {row['seconds']:6.1f}  {answer[:60]}"
        )
    plot = plot_profile_and_budgets(
        profile.scores,
        {row["method"]: row["layer_tokens"] for row in rows if row["method"] != "full" and row["budget"] == budgets[0]},
        out / "profile_budgets.png",
        title=f"{profile.model['name_or_path']}: sensitivity and tokens kept at budget {budgets[0]:g}",
        local_scores=profile.local_scores,
    )
    (out / "demo.json").write_text(
        json.dumps({"needle": needle.__dict__, "budgets": budgets, "rows": rows}, indent=2) + "\n"
    )
    print(f"\nplot: {plot}\nresults: {out / 'demo.json'}")
    return 0
