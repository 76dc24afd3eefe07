"""How stable is a sensitivity profile? Spearman rho between profiles measured with different settings.

Profiles SmolLM2-135M on the default calibration set (Paul Graham essays) under several settings and
prints the rank correlation of their per-layer scores with a reference profile, plus the time each took:

  * another noise seed (same samples): is one noise draw per layer enough?
  * more repeats;
  * other alphas (noise scales);
  * a disjoint half of the calibration samples (sample-to-sample variation).

    python benchmarks/profile_stability.py            # ~8 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import time

from scipy.stats import spearmanr
from transformers.utils import logging as hf_logging

from ripplekv.models.loading import load_model
from ripplekv.profiling.calibration import CalibrationSet, default_calibration
from ripplekv.profiling.sensitivity import ProfilingConfig, profile_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--context-tokens", type=int, default=2048)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    hf_logging.disable_progress_bar()
    model, tokenizer = load_model(args.model)
    calibration = default_calibration(tokenizer, n_samples=args.samples, context_tokens=args.context_tokens)
    half = len(calibration) // 2
    first = CalibrationSet(calibration.samples[:half], calibration.description + " (first half)")
    second = CalibrationSet(calibration.samples[half:], calibration.description + " (second half)")

    runs = {
        "reference: alpha 0.5, repeats 1, seed 0": (calibration, ProfilingConfig(alpha=0.5, repeats=1, seed=0)),
        "seed 1": (calibration, ProfilingConfig(alpha=0.5, repeats=1, seed=1)),
        "repeats 4": (calibration, ProfilingConfig(alpha=0.5, repeats=4, seed=0)),
        "alpha 0.25": (calibration, ProfilingConfig(alpha=0.25, repeats=1, seed=0)),
        "alpha 1.0": (calibration, ProfilingConfig(alpha=1.0, repeats=1, seed=0)),
        "first half of the samples": (first, ProfilingConfig(alpha=0.5, repeats=1, seed=0)),
        "second half of the samples": (second, ProfilingConfig(alpha=0.5, repeats=1, seed=0)),
    }
    profiles, seconds = {}, {}
    for name, (samples, config) in runs.items():
        start = time.perf_counter()
        profiles[name] = profile_model(model, tokenizer, samples, config)
        seconds[name] = time.perf_counter() - start
        print(f"{name:<45} {seconds[name]:6.1f} s", flush=True)

    reference = next(iter(profiles.values())).scores
    print(
        f"\n{args.model}: {len(calibration)} samples of {args.context_tokens} tokens; Spearman rho of the "
        "per-layer KL scores with the reference profile\n"
    )
    rows = []
    for name, profile in profiles.items():
        rho = spearmanr(reference, profile.scores).statistic
        rows.append(
            {
                "setting": name,
                "spearman_vs_reference": float(rho),
                "seconds": seconds[name],
                "scores": list(profile.scores),
            }
        )
        print(f"{name:<45} rho = {rho:6.3f}")
    halves = spearmanr(profiles["first half of the samples"].scores, profiles["second half of the samples"].scores)
    print(f"{'first half vs second half':<45} rho = {halves.statistic:6.3f}")
    kl_local = spearmanr(reference, next(iter(profiles.values())).local_scores).statistic
    print(f"{'reference KL vs its local signal':<45} rho = {kl_local:6.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "args": vars(args),
                    "rows": rows,
                    "halves_rho": float(halves.statistic),
                    "kl_vs_local_rho": float(kl_local),
                },
                f,
                indent=2,
            )
            f.write("\n")


if __name__ == "__main__":
    main()
