"""The README's headline table: RippleKV against its best rival, per model, suite, setting and budget.

Each line of the table is one committed run's verdict (``benchmarks/allocators_verdict.py``'s ``verdict.json``, or
``benchmarks/default_check.py``'s JSON for a held-out check), under SnapKV's scorer, on one metric: by default
fidelity KL (nats per token over the full cache's own greedy answer; lower is closer to the full cache), or
``--metric score`` (the task score; runs whose verdict lacks it are left out):

* RippleKV's macro mean (the mean over tasks of each task's mean);
* the best rival: the best macro mean among the run's other allocation families (uniform, depth, attention
  statistics, representation change; RippleKV's local-signal ablation is not a rival), chosen before testing;
* the paired difference of macro means (RippleKV - rival) with the stratified sign-flip test's inverted 95%
  interval and Holm p, as the verdict computed them;
* per prompt, read here from the run's ``results.jsonl``: wins / ties / losses (a win: RippleKV's value better) and
  the median and the tail quantile of the per-prompt difference where RippleKV is worse (the 90th percentile of a
  lower-is-better metric, the 10th of a higher-is-better one).

    python benchmarks/headline_table.py                 # the committed runs listed in RUNS
    python benchmarks/headline_table.py --json benchmarks/results/headline_table.json \
        > benchmarks/results/headline_table.md
    python benchmarks/headline_table.py --metric score   # task scores, runs that scored them
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ripplekv_eval.reporting.stats import METRICS

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SCORER = "snapkv"
RIVAL_FAMILIES = ("uniform", "depth", "attention statistics", "representation change")


@dataclass(frozen=True)
class Run:
    """One line group of the table: a committed run and the file holding its verdict."""

    model: str
    suite: str
    setting: str
    folder: str
    verdict: str = "verdict.json"


RUNS: tuple[Run, ...] = (
    Run("SmolLM2-135M", "LongBench, 211 prompts, 4K", "tuned", "allocators-longbench-tuned"),
    Run("SmolLM2-135M", "LongBench, 211 prompts, 4K", "default", "allocators-longbench"),
    Run("SmolLM2-135M", "RULER-style, 140 prompts, 4K", "tuned", "allocators-ruler-4k-tuned"),
    Run("SmolLM2-135M", "RULER-style, 140 prompts, 4K", "default", "allocators-ruler-4k"),
    Run(
        "SmolLM2-135M", "BAMBOO (held out), 169 prompts, 4K", "default", "heldout-bamboo", "previous_default_check.json"
    ),
    Run("Qwen2.5-Coder-0.5B", "LongBench, 124 prompts, 2K", "tuned", "qwen2.5-coder-0.5b/longbench-tuned"),
    Run("Qwen2.5-Coder-0.5B", "LongBench, 124 prompts, 2K", "default", "qwen2.5-coder-0.5b/longbench-default"),
    Run(
        "Qwen2.5-Coder-0.5B",
        "BAMBOO (held out), 169 prompts, 4K",
        "tuned",
        "qwen2.5-coder-0.5b/heldout-bamboo",
        "default_check_tuned.json",
    ),
    Run(
        "Qwen2.5-Coder-0.5B",
        "BAMBOO (held out), 169 prompts, 4K",
        "default",
        "qwen2.5-coder-0.5b/heldout-bamboo",
        "default_check.json",
    ),
)


def per_prompt(folder: Path, candidate: str, rival: str, budget: float, metric: str) -> list[float]:
    """RippleKV's minus the rival's value on every prompt holding both, at one budget, in the verdict's units (task
    scores x 100; rows written before the scorer was recorded are SnapKV's, the default scorer, as ``ripplekv
    report`` reads them)."""
    scale = METRICS[metric].scale
    values: dict[str, dict[str, float]] = {}
    with open(folder / "results.jsonl") as lines:
        for line in lines:
            row = json.loads(line)
            mine = row["method"] in (candidate, rival) and row.get("scorer", SCORER) == SCORER
            if mine and row["budget"] == budget and row.get(metric) is not None:
                values.setdefault(row["sample_id"], {})[row["method"]] = scale * row[metric]
    return [v[candidate] - v[rival] for v in values.values() if len(v) == 2]


def quantile(values: list[float], q: float) -> float:
    """The q-quantile, linear between order statistics (numpy's default)."""
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def lines_of(run: Run, metric: str = "fidelity_kl") -> list[dict[str, Any]]:
    """The table's lines for one run, one per budget (none when its verdict lacks ``metric``)."""
    folder = RESULTS / run.folder
    verdict = json.loads((folder / run.verdict).read_text())
    sign = 1.0 if METRICS[metric].higher_is_better else -1.0  # sign * value: larger is better
    out = []
    if "scorers" in verdict:  # allocators_verdict.py
        candidate = (verdict.get("settings") or {}).get("ripplekv", verdict["candidate"])
        for entry in verdict["scorers"][SCORER]["metrics"].get(metric, {}).get("budgets", []):
            rivals = [entry["comparisons"][f] for f in RIVAL_FAMILIES if f in entry["comparisons"]]
            best = max(rivals, key=lambda c: sign * c["other_mean"])
            out.append(_line(run, folder, candidate, entry["budget"], entry["ripplekv_mean"], best, metric))
    elif verdict.get("metric", "fidelity_kl") == metric:  # default_check.py: the candidate against SnapKV
        candidate = verdict["candidate"]
        for entry in verdict["budgets"]:
            best = dict(entry["candidate_minus"][SCORER], other=SCORER, other_mean=entry["means"][SCORER])
            out.append(_line(run, folder, candidate, entry["budget"], entry["means"][candidate], best, metric))
    return out


def _line(
    run: Run, folder: Path, candidate: str, budget: float, mean: float, best: dict[str, Any], metric: str
) -> dict[str, Any]:
    diffs = per_prompt(folder, candidate, best["other"], budget, metric)
    sign = 1.0 if METRICS[metric].higher_is_better else -1.0
    wins, ties = sum(sign * d > 0 for d in diffs), sum(d == 0 for d in diffs)
    if (wins, ties, len(diffs) - wins - ties) != (best["wins"], best["ties"], best["losses"]):
        raise SystemExit(f"{run.folder} {budget}: per-prompt counts disagree with {run.verdict}")
    return {
        "model": run.model,
        "suite": run.suite,
        "setting": run.setting,
        "run": run.folder,
        "budget": budget,
        "ripplekv": candidate,
        "ripplekv_mean": mean,
        "rival": best["other"],
        "rival_mean": best["other_mean"],
        "difference": best["difference"],
        "low": best["low"],
        "high": best["high"],
        "p_holm": best["p_holm"],
        "wins": wins,
        "ties": ties,
        "losses": len(diffs) - wins - ties,
        "median": statistics.median(diffs),
        **({"p10": quantile(diffs, 0.1)} if sign > 0 else {"p90": quantile(diffs, 0.9)}),
    }


def markdown(lines: list[dict[str, Any]], metric: str = "fidelity_kl") -> str:
    tail = "p10" if METRICS[metric].higher_is_better else "p90"
    head = (
        "| model | suite | setting | budget | RippleKV | best rival | RippleKV - rival [95% CI] | Holm p "
        f"| W/T/L | median / {tail} |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {x['model']} | {x['suite']} | {x['setting']} | {x['budget']:.0%} | {x['ripplekv_mean']:.3f} "
        f"| {x['rival'].split(':')[0]} {x['rival_mean']:.3f} "
        f"| {x['difference']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}] "
        f"| {x['p_holm']:.2g} | {x['wins']}/{x['ties']}/{x['losses']} | {x['median']:+.4f} / {x[tail]:+.4f} |\n"
        for x in lines
    )
    return head + body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the lines as JSON here")
    parser.add_argument("--metric", default="fidelity_kl", choices=sorted(METRICS), help="the verdicts' metric")
    args = parser.parse_args(argv)
    lines = [line for run in RUNS for line in lines_of(run, args.metric)]
    print(markdown(lines, args.metric), end="")
    if args.json:
        args.json.write_text(json.dumps(lines, indent=1) + "\n")


if __name__ == "__main__":
    main()
