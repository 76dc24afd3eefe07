"""A candidate default (r, gamma) from tuning runs: the setting with the lowest calibration KL relative to SnapKV.

    python benchmarks/choose_default.py benchmarks/results/tune-fair-longbench benchmarks/results/tune-fair-ruler-4k

For every (r, gamma) of the runs' grid (their ``tune.json``) and every run and budget, the setting's mean
calibration KL divided by uniform SnapKV's on the same calibration prompts (so a suite whose KL is larger does not
outweigh the other); the default is the setting with the lowest mean ratio over all (run, budget) cells. Only
calibration prompts are read: the runs' held-out prompts and the held-out source that checks the choice
(``benchmarks/default_check.py``) play no part. Settings the grid makes identical (with r = 4, every gamma >= 4
clips nothing) tie; the one listed first in the grid is kept. Prints the ranking as markdown. The candidate
becomes the default only if the held-out check confirms it; on BAMBOO it did not (r 16, gamma 12: docs/fair-fight.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def ratios(tune: dict[str, Any]) -> dict[str, list[float]]:
    """Setting key -> calibration KL / SnapKV's, one entry per budget of the run."""
    out: dict[str, list[float]] = {}
    for budget in tune["budgets"]:
        snapkv = float(budget["snapkv"]["calibration_kl"])
        for candidate in budget["candidates"]:
            out.setdefault(candidate["key"], []).append(float(candidate["calibration_kl"]) / snapkv)
    return out


def rank(runs: list[Path]) -> list[tuple[str, float, list[float]]]:
    """(setting, mean ratio, ratios per run and budget), best first; settings missing from a run are left out."""
    per_run = [ratios(json.loads((run / "tune.json").read_text())) for run in runs]
    keys = [k for k in per_run[0] if all(k in r for r in per_run)]
    rows = [(k, [x for r in per_run for x in r[k]]) for k in keys]
    return sorted(((k, sum(v) / len(v), v) for k, v in rows), key=lambda row: row[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="folders of `ripplekv tune` runs (tune.json)")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    ranking = rank(args.runs)
    budgets = [
        f"{run.name} {b['budget']:g}"
        for run in args.runs
        for b in json.loads((run / "tune.json").read_text())["budgets"]
    ]
    print("| setting | mean ratio to SnapKV | " + " | ".join(budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    for key, mean, values in ranking[: args.top]:
        print(f"| `{key.removeprefix('default|')}` | {mean:.3f} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    print(f"\ndefault: `{ranking[0][0].removeprefix('default|')}`")


if __name__ == "__main__":
    main()
