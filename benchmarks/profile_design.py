"""Profile design by rank agreement: which profile's per-layer scores best predict the measured per-layer damage?

Reads the damage rows of a ``ripplekv analyze`` run (``damage.jsonl``: for each held-out prompt and budget, the
fidelity loss of compressing each layer alone) and, for every profile given, the Spearman rho between its KL scores
and the mean damage per layer, with a 95% percentile bootstrap interval over prompts, plus each profile's paired
difference in rho to the first profile (the same resampled prompts for every profile, so the difference has its own
interval). Depth is listed for reference. The statistics are the library's (:mod:`ripplekv_eval.analysis.report`).

    python benchmarks/profile_design.py benchmarks/results/analyze-smollm2 \\
        --profile essays=benchmarks/results/smollm2-135m.profile.json --profile qa=qa.profile.json --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.analysis.report import PromptBootstrap, spearman, spearman_rows
from ripplekv_eval.analysis.runner import DAMAGE_FILE
from ripplekv_eval.running.results import ResultsLog


def _interval(values: np.ndarray) -> tuple[float, float]:
    defined = values[np.isfinite(values)]
    if not defined.size:
        return float("nan"), float("nan")
    low, high = np.percentile(defined, [2.5, 97.5])
    return float(low), float(high)


def compare(
    rows: list[dict[str, Any]], profiles: dict[str, SensitivityProfile], resamples: int, seed: int
) -> list[dict[str, Any]]:
    """Per budget: each profile's rho with the mean damage, its interval and its paired difference to the first."""
    out = []
    for budget in sorted({float(r["budget"]) for r in rows}):
        at = [r for r in rows if float(r["budget"]) == budget]
        damage = np.array([r["damage_kl"] for r in at], dtype=np.float64)
        prompts, layers = damage.shape
        bootstrap = PromptBootstrap.draw(prompts, resamples, seed)
        resampled = bootstrap.weights @ damage
        predictors = {"depth": np.arange(layers, dtype=np.float64)}
        for label, profile in profiles.items():
            if profile.num_layers != layers:
                raise ValueError(f"profile {label!r} has {profile.num_layers} layers, the damage rows {layers}")
            predictors[label] = np.asarray(profile.scores, dtype=np.float64)
        replicates = {
            label: spearman_rows(resampled, np.broadcast_to(p, resampled.shape)) for label, p in predictors.items()
        }
        first = next(iter(profiles))
        entries = []
        for label, predictor in predictors.items():
            estimate = bootstrap.rho(damage, np.tile(predictor, (prompts, 1)))
            low, high = _interval(replicates[label] - replicates[first])
            entries.append(
                {
                    "predictor": label,
                    "rho": spearman(damage.mean(axis=0), predictor),
                    "low": estimate.low,
                    "high": estimate.high,
                    "minus_first": float(estimate.rho - spearman(damage.mean(axis=0), predictors[first])),
                    "minus_first_low": low,
                    "minus_first_high": high,
                }
            )
        out.append({"budget": budget, "prompts": prompts, "first": first, "predictors": entries})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("damage", type=Path, help="a `ripplekv analyze` output folder (its damage.jsonl)")
    parser.add_argument("--profile", action="append", required=True, help="LABEL=PATH; the first is the reference")
    parser.add_argument("--resamples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    profiles = {}
    for item in args.profile:
        label, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--profile takes LABEL=PATH, got {item!r}")
        profiles[label] = SensitivityProfile.load(path)
    rows = ResultsLog(args.damage / DAMAGE_FILE).read()
    result = compare(rows, profiles, args.resamples, args.seed)
    for entry in result:
        print(f"\n## Budget {entry['budget']:g} ({entry['prompts']} prompts)\n")
        print(f"| predictor | rho with mean damage [95% CI] | minus {entry['first']} [95% CI] |")
        print("|---|---|---|")
        for p in entry["predictors"]:
            print(
                f"| {p['predictor']} | {p['rho']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}] | "
                f"{p['minus_first']:+.3f} [{p['minus_first_low']:+.3f}, {p['minus_first_high']:+.3f}] |"
            )
    if args.json:
        args.json.write_text(json.dumps({"damage": str(args.damage), "budgets": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
