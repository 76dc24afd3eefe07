"""Which layers a schedule keeps whole, prompt by prompt, and RippleKV's paired fidelity difference in each case.

A per-prompt schedule such as SqueezeAttention can give some layers the whole prompt (its most important group);
RippleKV's offline profile, clipped to ``[1/gamma, gamma]``, never does. For one evaluation folder this prints, per
scorer and budget: how many prompts had each set of whole layers under ``--method``, then ``--against``'s mean
``fidelity_kl`` minus ``--method``'s over the prompts where ``--layer`` was whole and over the others, with the tasks
of the first group. Means only (no interval): the paired tests are the report's and the verdict's.

    python benchmarks/whole_layers.py benchmarks/results/allocators-ruler-4k --method squeezeattention --layer 18
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ripplekv_eval.running.results import ResultsLog
from ripplekv_eval.sample import row_scorer, scored_methods


def load(run: Path) -> dict[tuple[str, str, str | None, float], dict[str, Any]]:
    """The rows of ``run/results.jsonl`` keyed by (sample, method, scorer, budget), scorers read as the report does."""
    rows = ResultsLog(run / "results.jsonl").read()
    scored = scored_methods(rows)
    return {(str(r["sample_id"]), str(r["method"]), row_scorer(r, scored), float(r["budget"])): r for r in rows}


def whole_layers(row: dict[str, Any]) -> tuple[int, ...]:
    """The layers that kept every prompt token (the prefix that was compressed)."""
    kept = row["kept_tokens"]
    return tuple(i for i, k in enumerate(kept) if k >= row["compressed_tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the evaluation folder")
    parser.add_argument("--method", default="squeezeattention", help="the schedule whose whole layers are counted")
    parser.add_argument("--against", default="ripplekv", help="the schedule compared with it")
    parser.add_argument("--layer", type=int, default=18, help="the layer that splits the prompts")
    args = parser.parse_args()
    rows = load(args.run)
    cells = sorted({(scorer, budget) for _, method, scorer, budget in rows if method == args.method})
    for scorer, budget in cells:
        sets: Counter[tuple[int, ...]] = Counter()
        split: dict[bool, list[float]] = defaultdict(list)
        tasks: Counter[str] = Counter()
        for (sample, method, s, b), row in rows.items():
            other = rows.get((sample, args.against, s, b))
            if method != args.method or (s, b) != (scorer, budget) or other is None:
                continue
            whole = whole_layers(row)
            sets[whole] += 1
            split[args.layer in whole].append(other["fidelity_kl"] - row["fidelity_kl"])
            if args.layer in whole:
                tasks[row["task"]] += 1
        print(f"{scorer} {100 * budget:g}%: whole layers of {args.method} (prompts): ", end="")
        print("; ".join(f"{list(k) if k else 'none'} {n}" for k, n in sets.most_common()))
        for group in (True, False):
            values = split.get(group, [])
            if values:
                label = f"layer {args.layer} {'whole' if group else 'not whole'}"
                mean = sum(values) / len(values)
                print(f"  {label}: {len(values)} prompts, mean {args.against} - {args.method} {mean:+.3f}")
        if tasks:
            print("  tasks where it was whole: " + ", ".join(f"{t} {n}" for t, n in sorted(tasks.items())))


if __name__ == "__main__":
    main()
