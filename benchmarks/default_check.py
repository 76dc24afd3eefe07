"""Check RippleKV's default on held-out data: per budget, each setting against the previous default and SnapKV.

    python benchmarks/default_check.py benchmarks/results/heldout-bamboo --candidate 'ripplekv:r=16,gamma=12' \
        --json benchmarks/results/heldout-bamboo/default_check.json \
        --md benchmarks/results/heldout-bamboo/default_check.md

Reads an evaluation folder's rows (``ripplekv eval --score fidelity``) and, for every budget and every RippleKV
setting the run holds, the macro mean of a metric (the mean over tasks of each task's mean; default fidelity KL,
lower is better; a metric where higher is better, such as top-1 agreement, is negated, so a win is always the
candidate better), then the candidate default against each other configuration, prompt by prompt: the difference
of macro means with the stratified sign-flip test's inverted 95% interval, wins / ties / losses (a win: the
candidate lower) and the p-value, Holm-adjusted over the comparisons of one budget. A schedule that wins the mean
but loses most prompts shows here as a negative difference with more losses than wins; the median and the 90th
percentile of the per-prompt difference (candidate minus other: the tail where the candidate is worse) show it too.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from ripplekv_eval.analysis.tuning_report import KL, comparison_record, macro_mean
from ripplekv_eval.reporting.stats import ALPHA, SignFlip, compare, settle

Samples = dict[str, dict[str, float]]

HIGHER_IS_BETTER = ("top1_agreement", "score")
"""Metrics compared negated, so that a win is always the candidate better and the difference stays "lower"."""


def load(run: Path, metric: str) -> dict[tuple[str, float], Samples]:
    """(method, budget) -> task -> prompt id -> metric, for the rows of SnapKV's scorer (and none for full)."""
    out: dict[tuple[str, float], Samples] = {}
    for line in (run / "results.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row["method"] == "full" or row.get(metric) is None:
            continue
        key = (str(row["method"]), float(row["budget"]))
        value = -float(row[metric]) if metric in HIGHER_IS_BETTER else float(row[metric])
        out.setdefault(key, {}).setdefault(str(row["task"]), {})[str(row["sample_id"])] = value
    return out


def complete(samples: dict[tuple[str, float], Samples]) -> set[str]:
    """Prompt ids that every (method, budget) has (a running run's newest prompt may lack some)."""
    sets = [{i for task in s.values() for i in task} for s in samples.values()]
    return set.intersection(*sets) if sets else set()


def restrict(samples: Samples, ids: set[str]) -> Samples:
    return {task: {i: v for i, v in values.items() if i in ids} for task, values in samples.items()}


def check(run: Path, candidate: str, metric: str, draws: int, seed: int) -> dict[str, Any]:
    """The summary of the module docstring as plain JSON types."""
    samples = load(run, metric)
    ids = complete(samples)
    methods = sorted({m for m, _ in samples}, key=lambda m: (m != "snapkv", m != candidate, m))
    if candidate not in methods:
        raise SystemExit(f"{run} has no rows of {candidate!r}; it holds {', '.join(methods)}")
    flip = SignFlip(draws=draws, seed=seed)
    budgets: list[dict[str, Any]] = []
    for budget in sorted({b for _, b in samples}):
        means = {m: macro_mean(restrict(samples[(m, budget)], ids)) for m in methods if (m, budget) in samples}
        others = [other for other in means if other != candidate]
        mine = restrict(samples[(candidate, budget)], ids)
        tests = compare(KL, [(candidate, o, mine, restrict(samples[(o, budget)], ids)) for o in others], flip)
        versus = {other: comparison_record(c) for other, c in zip(others, settle(tests, ALPHA))}
        for other, record in versus.items():
            theirs = restrict(samples[(other, budget)], ids)
            diffs = [v - theirs[task][i] for task, values in mine.items() for i, v in values.items()]
            record["median"] = statistics.median(diffs)
            record["p90"] = statistics.quantiles(diffs, n=100, method="inclusive")[89]  # as headline_table.py
        budgets.append({"budget": budget, "means": means, "candidate_minus": versus})
    return {"run": str(run), "metric": metric, "candidate": candidate, "prompts": len(ids), "budgets": budgets}


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['prompts']} prompts of {summary['run']}; metric {summary['metric']}"
        f"{' negated' if summary['metric'] in HIGHER_IS_BETTER else ''} (lower is better); "
        f"candidate `{summary['candidate']}`",
        "",
        "| budget | configuration | macro mean | candidate minus it [95% interval] | W/T/L (candidate lower = W) | "
        "median / p90 | Holm p |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in summary["budgets"]:
        for method, mean in b["means"].items():
            c = b["candidate_minus"].get(method)
            if c is None:
                cells = ["(candidate)", "", "", ""]
            else:
                low = "-inf" if c["low"] is None else f"{c['low']:+.4f}"
                high = "+inf" if c["high"] is None else f"{c['high']:+.4f}"
                mark = " (significant)" if c["significant"] else ""
                cells = [
                    f"{c['difference']:+.4f} [{low}, {high}]",
                    f"{c['wins']}/{c['ties']}/{c['losses']}",
                    f"{c['median']:+.4f} / {c['p90']:+.4f}" if "median" in c else "",
                    f"{c['p_holm']:.3g}{mark}",
                ]
            lines.append(f"| {b['budget']:g} | `{method}` | {mean:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--candidate", required=True, help="the method spec of the default under test")
    parser.add_argument("--metric", default="fidelity_kl")
    parser.add_argument("--permutations", type=int, default=19999)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args()
    summary = check(args.run, args.candidate, args.metric, args.permutations, args.seed)
    text = markdown(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.md:
        args.md.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
