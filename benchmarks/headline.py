"""The README's headline tables of an evaluation run: does one method beat the baselines, by how much, how surely.

For every metric the run holds (task score, fidelity KL, top-1 agreement, gold-answer NLL change) it prints

1. each method's mean at each budget with its 95% BCa bootstrap interval (stratified by task), as ``ripplekv report``;
2. the candidate's (default ``ripplekv``) paired difference ``candidate - baseline`` to each baseline at each budget:
   the macro mean of the per-sample differences, wins/ties/losses over samples, the stratified sign-flip permutation
   test of that macro mean and its inverted 95% interval (:mod:`ripplekv_eval.reporting.stats`),
   Holm-adjusted over the candidate's comparisons with the baselines at that budget and metric (``--family budget``,
   default) or at every budget of the metric (``--family metric``); the best baseline (by mean) is named.
   **Significant** = the Holm p < 0.05 (the rule of ``ripplekv report``); a significant difference's interval
   excludes 0.

Only samples holding every configuration enter (as in ``ripplekv report``). The statistics are the library's
(:mod:`ripplekv_eval.reporting.stats`); this script only chooses the comparisons.

    python benchmarks/headline.py benchmarks/results/longbench-fidelity
    python benchmarks/headline.py RUN --candidate ripplekv --baselines snapkv,adakv --json out.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ripplekv.cli.args import method_list, method_spec_arg
from ripplekv_eval.reporting.report import load_run
from ripplekv_eval.reporting.stats import (
    ALPHA,
    DEFAULT_DRAWS,
    FAMILIES,
    METRICS,
    TEST_NAME,
    Bootstrap,
    SignFlip,
    collect,
    compare,
    settle,
)
from ripplekv_eval.running.config import FULL_BUDGET
from ripplekv_eval.running.results import complete_samples

DEFAULT_BASELINES = "streamingllm,snapkv,pyramidkv,adakv"


def _pct(budget: float) -> str:
    return f"{budget * 100:g}%"


def _interval(low: float, high: float) -> dict:
    return {"low": low if np.isfinite(low) else None, "high": high if np.isfinite(high) else None}


def analyse(
    run: Path,
    candidate: str,
    baselines: list[str],
    resamples: int,
    seed: int,
    draws: int = DEFAULT_DRAWS,
    family: str = "budget",
) -> dict:
    config, rows = load_run(run)
    methods = [m for m in config["config"]["methods"]]
    budgets = [float(b) for b in config["config"]["budgets"]]
    missing = [m for m in [candidate, *baselines] if m not in methods]
    if missing:
        raise SystemExit(f"the run has no method(s) {', '.join(missing)} (it has {', '.join(methods)})")
    configurations = [(m, FULL_BUDGET) if m == "full" else (m, b) for m in methods for b in budgets]
    rows, incomplete = complete_samples(rows, configurations)
    if family not in FAMILIES:
        raise SystemExit(f"--family must be one of {', '.join(FAMILIES)}")
    bootstrap = Bootstrap(resamples=resamples, seed=seed)
    flip = SignFlip(draws=draws, seed=seed)
    out: dict = {"run": str(run), "candidate": candidate, "baselines": baselines, "incomplete_samples": incomplete}
    out["test"] = {
        "name": TEST_NAME,
        "draws": draws,
        "seed": seed,
        "exact_max_samples": flip.exact_max,
        "family": family,
        "family_description": "the candidate's comparisons with the baselines at one budget and metric"
        if family == "budget"
        else "the candidate's comparisons with the baselines over all budgets of one metric",
        "adjustment": "holm",
        "alpha": ALPHA,
    }
    out["metrics"] = {}
    for name, metric in METRICS.items():
        values = collect(rows, metric, lambda row: str(row.get("task", "")))
        if not any(key[0] == candidate for key in values):
            continue
        estimates = {f"{m}@{b}": asdict(bootstrap.estimate(s)) for (m, b), s in values.items() if s}
        per_budget, raw = [], []
        for budget in budgets:
            pairs = [(candidate, b, values[candidate, budget], values[b, budget]) for b in baselines]
            raw.append(compare(metric, pairs, flip))
        groups = [[i] for i in range(len(budgets))] if family == "budget" else [list(range(len(budgets)))]
        for group in groups:
            settled = iter(settle([c for i in group for c in raw[i]], ALPHA))
            for i in group:
                raw[i] = [next(settled) for _ in raw[i]]
        for budget, tests in zip(budgets, raw):
            comparisons = []
            for baseline, c in zip(baselines, tests):
                d = c.difference
                comparisons.append(
                    {
                        "baseline": baseline,
                        "baseline_mean": estimates[f"{baseline}@{budget}"]["mean"],
                        "difference": {"mean": d.mean, **_interval(d.low, d.high), "samples": d.samples}
                        | {"tasks": d.tasks, "interval": d.method},
                        "wins": c.wins,
                        "ties": c.ties,
                        "losses": c.losses,
                        "p": c.p,
                        "p_holm": c.p_holm,
                        "significant": c.significant,
                        "test": c.test,
                        "sign_vectors": c.vectors,
                    }
                )
            sign = 1.0 if metric.higher_is_better else -1.0
            best = max(comparisons, key=lambda c: sign * c["baseline_mean"])["baseline"]
            per_budget.append({"budget": budget, "best_baseline": best, "comparisons": comparisons})
        out["metrics"][name] = {
            "higher_is_better": metric.higher_is_better,
            "scale": metric.scale,
            "decimals": metric.decimals,
            "estimates": estimates,
            "budgets": per_budget,
        }
    samples = {str(row["sample_id"]) for row in rows}
    out["samples"] = len(samples)
    out["methods"], out["all_budgets"] = methods, budgets
    return out


def _fmt(value: float | None, digits: int, sign: bool = False) -> str:
    if value is None:
        return "inf"  # an unbounded end (JSON null)
    text = f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"
    return f"{0.0:.{digits}f}" if float(text) == 0.0 else text


def _comparison_cell(c: dict, digits: int) -> str:
    d = c["difference"]
    verdict = "**significant**" if c["significant"] else "not significant"
    interval = f"{_fmt(d['mean'], digits, True)} [{_fmt(d['low'], digits, True)}, {_fmt(d['high'], digits, True)}]"
    return f"{interval}, {c['wins']}/{c['ties']}/{c['losses']}, p={c['p']:.2g} (Holm {c['p_holm']:.2g}): {verdict}"


def _test_line(result: dict) -> str:
    t = result["test"]
    return (
        f"Test: {t['name']}; exact up to {t['exact_max_samples']} samples, otherwise {t['draws']} random sign vectors "
        f"+ the identity (seed {t['seed']}). Holm over {t['family_description']}; significant = Holm p < "
        f"{t['alpha']:g}."
    )


def markdown(result: dict) -> str:
    lines = [f"{result['samples']} samples with every configuration ({result['incomplete_samples']} left out)", ""]
    lines += [_test_line(result), ""]
    candidate = result["candidate"]
    for name, metric in result["metrics"].items():
        digits = 3 if name == "fidelity_kl" else metric["decimals"]
        direction = "higher is better" if metric["higher_is_better"] else "lower is better"
        lines += [f"**{name}** ({direction}): mean and 95% interval", ""]
        lines += ["| method | " + " | ".join(_pct(b) for b in result["all_budgets"]) + " |"]
        lines += ["|---|" + "---|" * len(result["all_budgets"])]
        for method in result["methods"]:
            if method == "full":
                continue
            cells = []
            for budget in result["all_budgets"]:
                e = metric["estimates"].get(f"{method}@{budget}")
                interval = "–" if e is None else f"{_fmt(e['mean'], digits)} [{_fmt(e['low'], digits)}, "
                cells.append(interval if e is None else f"{interval}{_fmt(e['high'], digits)}]")
            shown = f"**{method}**" if method == candidate else method
            lines.append(f"| {shown} | " + " | ".join(cells) + " |")
        lines += ["", f"`{candidate} - baseline`, paired (95% interval; W/T/L over samples; sign-flip p, Holm):", ""]
        lines += ["| budget | best baseline | vs best baseline | vs snapkv |", "|---|---|---|---|"]
        for entry in metric["budgets"]:
            by_name = {c["baseline"]: c for c in entry["comparisons"]}
            snap = _comparison_cell(by_name["snapkv"], digits) if "snapkv" in by_name else "–"
            best = entry["best_baseline"]
            lines.append(f"| {_pct(entry['budget'])} | {best} | {_comparison_cell(by_name[best], digits)} | {snap} |")
        lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line; method lists are method specs, so a parameterised one keeps its commas."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="an evaluation folder (config.json + results.jsonl)")
    parser.add_argument("--candidate", type=method_spec_arg, default="ripplekv")
    parser.add_argument("--baselines", type=method_list, default=DEFAULT_BASELINES, help="comma-separated method specs")
    parser.add_argument("--resamples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--permutations", type=int, default=DEFAULT_DRAWS, help="random sign vectors per comparison")
    parser.add_argument("--family", choices=tuple(FAMILIES), default="budget", help="Holm's family (default budget)")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    baselines = list(args.baselines)
    result = analyse(args.run, args.candidate, baselines, args.resamples, args.seed, args.permutations, args.family)
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
