"""Issue 17's verdict: is RippleKV's allocation closer to the full cache than each family of per-layer allocation?

For an evaluation folder over several schedules and token scorers (``benchmarks/allocators.sh``), per scorer, budget
and metric, RippleKV's paired difference (``ripplekv - other``) to one representative of each family, over the
same scorer and the same samples:

* ``uniform``: ``snapkv`` (the uniform schedule over that scorer);
* ``depth``: ``pyramidkv``;
* ``attention statistics``: the best of ``cake``, ``dynamickv`` and ``lava`` at that budget (by the metric's mean,
  chosen before testing, as ``ripplekv report``'s "best other");
* ``representation change``: ``squeezeattention``;
* ``local signal``: ``ripplekv-local`` (RippleKV's own ablation).

Each difference gets the stratified sign-flip permutation test of its macro mean and the interval inverting it
(:mod:`ripplekv_eval.reporting.stats`), Holm-adjusted over the five comparisons of one scorer, budget
and metric; **significant** = Holm p < 0.05. The thesis line of a budget says, per scorer, whether RippleKV is
significantly better than both the attention-statistics and the representation-change representative (*holds*),
significantly worse than either (*fails*), or neither (*not shown*). Only samples holding every configuration of
the scorer enter.

    python benchmarks/allocators_verdict.py benchmarks/results/allocators-longbench
    python benchmarks/allocators_verdict.py RUN --metrics fidelity_kl --json RUN/verdict.json --md RUN/verdict.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ripplekv.presses.method_spec import base_method
from ripplekv_eval.reporting.report import row_scorers, rows_of_scorer
from ripplekv_eval.reporting.stats import (
    ALPHA,
    DEFAULT_DRAWS,
    METRICS,
    TEST_NAME,
    Bootstrap,
    SignFlip,
    collect,
    compare,
    settle,
)
from ripplekv_eval.reporting.summary import load_run, summarize
from ripplekv_eval.running.results import complete_samples
from ripplekv_eval.sample import FULL_BUDGET

CANDIDATE = "ripplekv"
FAMILIES: dict[str, tuple[str, ...]] = {
    "uniform": ("snapkv",),
    "depth": ("pyramidkv",),
    "attention statistics": ("cake", "dynamickv", "lava", "lava-layer"),
    "representation change": ("squeezeattention",),
    "local signal": ("ripplekv-local",),
}
THESIS = ("attention statistics", "representation change")


def resolve(methods: list[str]) -> tuple[str | None, dict[str, tuple[str, ...]]]:
    """The run's configuration standing for the candidate and for each family's methods, matched by method name
    whatever parameters a run gave them (``cake:tau1=2`` is CAKE, ``ripplekv:r=16,gamma=12`` RippleKV): one
    configuration per method (a run holding two settings of one method is refused), families' absent members left
    out (``lava-layer`` in runs before it existed)."""
    by_base: dict[str, str] = {}
    for name in methods:
        base = base_method(name)
        if base in by_base:
            raise SystemExit(f"two settings of {base} in the run ({by_base[base]}, {name}): the verdict needs one each")
        by_base[base] = name
    families = {f: tuple(by_base[m] for m in members if m in by_base) for f, members in FAMILIES.items()}
    return by_base.get(CANDIDATE), families


def analyse(run: Path, metrics: list[str], resamples: int, seed: int, draws: int) -> dict[str, Any]:
    """Every comparison of the module docstring, as plain JSON types."""
    config, rows = load_run(run)
    summary = summarize(config, rows)
    bootstrap, flip = Bootstrap(resamples=resamples, seed=seed), SignFlip(draws=draws, seed=seed)
    present = {base_method(m) for m in summary.methods}
    families = {f: tuple(m for m in members if m in present) for f, members in FAMILIES.items()}
    out: dict[str, Any] = {"run": str(run), "candidate": CANDIDATE, "families": families, "scorers": {}}
    out["test"] = {"name": TEST_NAME, "draws": draws, "seed": seed, "alpha": ALPHA, "adjustment": "holm"}
    out["test"]["family"] = "the five comparisons of one scorer, budget and metric"
    for scorer in row_scorers(rows):
        kept, methods = rows_of_scorer(rows, summary.methods, scorer)
        candidate, families = resolve(methods)
        missing = ([] if candidate else [CANDIDATE]) + [f for f, members in families.items() if not members]
        if missing:
            out["scorers"][scorer] = {"skipped": f"no rows of {', '.join(missing)}"}
            continue
        needed = [candidate, *(m for members in families.values() for m in members)]
        if any(m != base_method(m) for m in needed):  # a run of tuned settings names them
            out["settings"] = {base_method(m): m for m in needed}
        configurations = [("full", FULL_BUDGET)] + [(m, b) for m in needed for b in summary.budgets]
        complete, incomplete = complete_samples(kept, configurations)
        entry: dict[str, Any] = {"samples": len({r["sample_id"] for r in complete}), "incomplete": incomplete}
        entry["metrics"] = {}
        for name in metrics:
            metric = METRICS[name]
            values = collect(complete, metric, lambda row: str(row.get("task", "")))
            if not values.get((candidate, summary.budgets[0])):
                continue
            sign = 1.0 if metric.higher_is_better else -1.0
            per_budget = []
            for budget in summary.budgets:
                means = {m: bootstrap.estimate(values[m, budget]) for m in needed}
                chosen = {
                    family: max(members, key=lambda m: sign * means[m].mean) for family, members in families.items()
                }
                pairs = [
                    (candidate, other, values[candidate, budget], values[other, budget]) for other in chosen.values()
                ]
                tests = compare(metric, pairs, flip)
                settled = settle(tests, ALPHA)
                comparisons = {}
                for (family, other), c in zip(chosen.items(), settled):
                    better = (c.difference.mean > 0) == metric.higher_is_better
                    comparisons[family] = {
                        "other": other,
                        "other_mean": means[other].mean,
                        "difference": c.difference.mean,
                        "low": c.difference.low,
                        "high": c.difference.high,
                        "wins": c.wins,
                        "ties": c.ties,
                        "losses": c.losses,
                        "p": c.p,
                        "p_holm": c.p_holm,
                        "significant": c.significant,
                        "ripplekv_better": better,
                    }
                thesis = [comparisons[f] for f in THESIS]
                if all(c["significant"] and c["ripplekv_better"] for c in thesis):
                    verdict = "holds"
                elif any(c["significant"] and not c["ripplekv_better"] for c in thesis):
                    verdict = "fails"
                else:
                    verdict = "not shown"
                per_budget.append(
                    {
                        "budget": budget,
                        "ripplekv_mean": means[candidate].mean,
                        "comparisons": comparisons,
                        "thesis": verdict,
                    }
                )
            entry["metrics"][name] = {"decimals": metric.decimals, "budgets": per_budget}
        out["scorers"][scorer] = entry
    return out


def _num(value: float, digits: int, sign: bool = False) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    text = f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"
    return f"{0.0:.{digits}f}" if float(text) == 0.0 else text


def markdown(result: dict[str, Any]) -> str:
    """The verdict lines, then one table per metric and scorer."""
    t = result["test"]
    lines = [
        f"Test: {t['name']} ({t['draws']} random sign vectors beyond the exact limit, seed {t['seed']}); Holm over "
        f"{t['family']}; significant = Holm p < {t['alpha']:g}. `ripplekv - other`, paired.",
        "",
    ]
    if "settings" in result:
        lines += ["Settings: " + ", ".join(f"`{spec}`" for spec in result["settings"].values()), ""]
    scorers = {s: e for s, e in result["scorers"].items() if "metrics" in e}
    metrics = dict.fromkeys(m for e in scorers.values() for m in e["metrics"])
    for name in metrics:
        budgets = sorted({b["budget"] for e in scorers.values() for b in e["metrics"].get(name, {}).get("budgets", [])})
        lines += [
            f"**Thesis ({name})**: is RippleKV significantly better than both the attention-statistics and the "
            "representation-change representative over the same scorer (holds), significantly worse than either "
            "(fails), or neither (not shown)?",
            "",
        ]
        for budget in budgets:
            parts = []
            for scorer, entry in scorers.items():
                found = [b for b in entry["metrics"].get(name, {}).get("budgets", []) if b["budget"] == budget]
                if found:
                    parts.append(f"{scorer}: {found[0]['thesis']}")
            lines.append(f"- budget {100 * budget:g}%: " + "; ".join(parts))
        lines.append("")
    for scorer, entry in scorers.items():
        for name, data in entry["metrics"].items():
            digits = 3 if name == "fidelity_kl" else data["decimals"]
            lines += [f"### {name}, scorer {scorer} ({entry['samples']} samples)", ""]
            lines += ["| budget | ripplekv | " + " | ".join(FAMILIES) + " |", "|---|---|" + "---|" * len(FAMILIES)]
            for b in data["budgets"]:
                cells = []
                for family in FAMILIES:
                    c = b["comparisons"][family]
                    mark = " **sig**" if c["significant"] else ""
                    cells.append(
                        f"{c['other']} {_num(c['other_mean'], digits)}: {_num(c['difference'], digits, True)} "
                        f"[{_num(c['low'], digits, True)}, {_num(c['high'], digits, True)}] "
                        f"{c['wins']}/{c['ties']}/{c['losses']} p={c['p_holm']:.2g}{mark}"
                    )
                lines.append(
                    f"| {100 * b['budget']:g}% | {_num(b['ripplekv_mean'], digits)} | " + " | ".join(cells) + " |"
                )
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="an evaluation folder (config.json + results.jsonl)")
    parser.add_argument("--metrics", default="fidelity_kl,top1_agreement,gold_nll_delta")
    parser.add_argument("--resamples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--permutations", type=int, default=DEFAULT_DRAWS, help="random sign vectors per comparison")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    parser.add_argument("--md", default=None, help="also write the markdown to this file")
    args = parser.parse_args()
    metrics = [m for m in args.metrics.split(",") if m]
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        parser.error(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    result = analyse(args.run, metrics, args.resamples, args.seed, args.permutations)
    text = markdown(result)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
