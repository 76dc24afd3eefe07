"""Profiling in bfloat16 against float32: how far the per-layer scores move, by arithmetic of the passes.

Loads SmolLM2-135M in bfloat16, copies it to float32 (the same, bfloat16-rounded, weights) and profiles both on
the same essay windows. The float32 model is the reference; the bfloat16 model is profiled with each
``ProfilingConfig.precision``:

  * ``model``: norm, output projection and continuation layers in bfloat16 (the arithmetic before float32 passes);
  * ``float32-head``: the final norm and output projection in float32, the continuation layers in bfloat16;
  * ``float32``: both in float32 (the default); only the prefill is bfloat16.

For each it prints the Spearman rho of the per-layer KL scores with the reference and the max / median relative
error of a layer's score, and writes the table (``--out``, ``.txt``) and the scores (``.json``).

    python benchmarks/profile_bf16.py   # 2 windows of 512 + 32 tokens, alpha 0.5, seed 0: ~5 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from transformers.utils import logging as hf_logging

from ripplekv.models.loading import load_model
from ripplekv.profiling.calibration import default_calibration
from ripplekv.profiling.passes import PRECISIONS
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model


def agreement(scores: list[float], reference: list[float]) -> dict[str, float]:
    """Spearman rho and max / median relative error of ``scores`` against ``reference``."""
    got, want = np.array(scores), np.array(reference)
    relative = np.abs(got - want) / want
    return {
        "spearman": float(spearmanr(got, want).statistic),
        "max_relative_error": float(relative.max()),
        "median_relative_error": float(np.median(relative)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--context-tokens", type=int, default=512)
    parser.add_argument("--continuation-tokens", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/profile_bf16", help="writes OUT.txt and OUT.json")
    args = parser.parse_args()

    hf_logging.disable_progress_bar()
    half, tokenizer = load_model(args.model, dtype=torch.bfloat16, device="cpu")
    full = copy.deepcopy(half).float()
    calibration = default_calibration(
        tokenizer,
        n_samples=args.samples,
        context_tokens=args.context_tokens,
        continuation_tokens=args.continuation_tokens,
        seed=args.seed,
    )

    def run(model: torch.nn.Module, precision: str) -> tuple[list[float], float]:
        config = ProfilingConfig(alpha=args.alpha, seed=args.seed, precision=precision)
        start = time.perf_counter()
        profile = profile_model(model, tokenizer, calibration, config)
        return list(profile.scores), time.perf_counter() - start

    reference, reference_seconds = run(full, "float32")
    rows = []
    for precision in PRECISIONS[::-1]:  # model, float32-head, float32
        scores, seconds = run(half, precision)
        rows.append({"precision": precision, "seconds": seconds, "scores": scores, **agreement(scores, reference)})

    lines = [
        f"{args.model}: bfloat16 profile vs the same weights in float32; {len(calibration)} essay windows of "
        f"{args.context_tokens} + {args.continuation_tokens} tokens, alpha {args.alpha}, seed {args.seed}",
        f"reference (float32 model) scores {min(reference):.2e} .. {max(reference):.2e}, {reference_seconds:.0f} s",
        "",
        f"{'bfloat16, precision':<22} {'rho':>6} {'max rel err':>12} {'median rel err':>15} {'seconds':>8}",
    ]
    for row in rows:
        lines.append(
            f"{row['precision']:<22} {row['spearman']:6.3f} {row['max_relative_error']:12.3f} "
            f"{row['median_relative_error']:15.3f} {row['seconds']:8.0f}"
        )
    lines += [
        "",
        "command: python benchmarks/profile_bf16.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(text)
    data = {"args": vars(args), "reference_scores": reference, "reference_seconds": reference_seconds, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
