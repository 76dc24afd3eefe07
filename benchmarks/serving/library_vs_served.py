"""Library vs served: RippleKV's KL advantage over SnapKV-uniform in the library and in the vLLM plugin, on the same
prompts and the same teacher-forced answers (issue 43, item 2). Main environment, after ``granularity.py`` and
``served_fidelity.py``:

    python benchmarks/serving/library_vs_served.py --library DIR --served DIR2 --model NAME --out FILE.md

Library: ``granularity.py``'s ``library-uniform`` and ``library-ripplekv`` rows (the library's own budgets), and its
``served-uniform`` / ``served-layer`` rows (the library at the plugin's block-rounded budgets). Served: the engine's
``snapkv-B`` and ``ripplekv-B`` runs. The advantage is SnapKV's mean KL minus RippleKV's; "kept" is the served
advantage over the library's; the paired test is the project's task-stratified sign-flip test
(``ripplekv_eval.reporting.stats.SignFlip``) of RippleKV minus SnapKV per prompt, with wins/ties/losses (a win:
RippleKV's KL lower), the median and 90th percentile of the difference.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from ripplekv_eval.reporting.stats import SignFlip


def paired(snapkv: dict[int, float], ripplekv: dict[int, float]) -> dict[str, Any]:
    """Mean RippleKV - SnapKV with its sign-flip interval and p, W/T/L, median and p90, over the common prompts."""
    prompts = sorted(set(snapkv) & set(ripplekv))
    diffs = [ripplekv[p] - snapkv[p] for p in prompts]
    (test,) = SignFlip().test([{"bamboo": {str(p): d for p, d in zip(prompts, diffs)}}])
    return {
        "n": len(prompts),
        "snapkv": float(np.mean([snapkv[p] for p in prompts])),
        "ripplekv": float(np.mean([ripplekv[p] for p in prompts])),
        "diff": test.mean,
        "low": test.low,
        "high": test.high,
        "p": test.p,
        "wtl": (sum(d < 0 for d in diffs), sum(d == 0 for d in diffs), sum(d > 0 for d in diffs)),
        "median": float(np.median(diffs)),
        "p90": float(np.percentile(diffs, 90)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", type=Path, required=True, help="granularity.py's output folder")
    parser.add_argument("--served", type=Path, required=True, help="served_fidelity.py's output folder")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = [json.loads(line) for line in (args.library / "rows.jsonl").read_text().splitlines()]
    library: dict[tuple[float, str], dict[int, dict[str, float]]] = {}
    for row in rows:
        library.setdefault((row["budget"], row["design"]), {})[row["prompt"]] = row
    served = {path.stem: json.loads(path.read_text()) for path in args.served.glob("*.json") if path.stem != "full"}
    lines = [
        f"## {args.model}: library vs served ({len({r['prompt'] for r in rows})} BAMBOO prompts)",
        "",
        "| budget | setting | where | SnapKV KL | RippleKV KL | RippleKV - SnapKV [95% CI] | p | W/T/L | "
        "median / p90 | advantage kept | top-1 SnapKV / RippleKV |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out: dict[str, Any] = {}
    for name in sorted(served, key=lambda n: (float(n.split("-")[1].split("@")[0]), n)):  # by budget
        method, rest = name.split("-", 1)
        if method != "ripplekv":
            continue
        rest, _, tag = rest.partition("@")
        budget_text, _, groups = rest.partition("-g")
        budget, suffix = float(budget_text), f"@{tag}" if tag else ""
        design = f"served-tiers-{groups}{suffix}" if groups else f"served-layer{suffix}"
        label = f"{tag or 'r 4, gamma 3'}, {f'{groups} tiers' if groups else 'per layer'}"
        snap = served.get(f"snapkv-{budget_text}")
        if snap is None:
            continue
        sides = {
            "library": (library[(budget, "library-uniform")], library[(budget, f"library-ripplekv{suffix}")]),
            "library, served budgets": (
                library[(budget, "served-uniform")],
                library[(budget, design)],
            ),
            "served (vLLM)": (
                {int(k): v for k, v in snap["rows"].items()},
                {int(k): v for k, v in served[name]["rows"].items()},
            ),
        }
        base = None
        for where, (s_rows, r_rows) in sides.items():
            result = paired({p: r["kl"] for p, r in s_rows.items()}, {p: r["kl"] for p, r in r_rows.items()})
            prompts = sorted(set(s_rows) & set(r_rows))
            top1 = (np.mean([s_rows[p]["top1"] for p in prompts]), np.mean([r_rows[p]["top1"] for p in prompts]))
            base = -result["diff"] if base is None else base
            kept = f"{-result['diff'] / base:.0%}" if where != "library" else ""
            w, t, lose = result["wtl"]
            lines.append(
                f"| {budget:g} | {label} | {where} | {result['snapkv']:.4f} | {result['ripplekv']:.4f} "
                f"| {result['diff']:+.4f} [{result['low']:+.4f}, {result['high']:+.4f}] | {result['p']:.3g} | "
                f"{w}/{t}/{lose} | {result['median']:+.4f} / {result['p90']:+.4f} | {kept} | "
                f"{top1[0]:.3f} / {top1[1]:.3f} |"
            )
            out[f"{name}|{where}"] = result
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
