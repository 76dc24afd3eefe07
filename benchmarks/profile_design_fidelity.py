"""Profile design by fidelity: does any profile variant bring RippleKV closer to the full cache than the reference?

Reads the rows of a ``ripplekv tune`` run that evaluated several profiles at the same r and gamma (one ``--profile``
per variant; ``tune.jsonl``: per held-out prompt and budget, the KL to the full cache over the full cache's own
answer of RippleKV with each profile, and of uniform SnapKV). The variants' calibration data is disjoint from these
prompts, so **every** prompt is held out for this comparison (tune's own calibration/held-out split is for choosing r
and gamma, not used here).

Per budget, for every variant: its macro mean KL (each task's mean, averaged over tasks), its paired difference to
the reference profile (the macro mean of the per-prompt differences) with wins/ties/losses (a win: lower KL), the
stratified sign-flip permutation test of that macro mean, the interval inverting it
(:mod:`ripplekv_eval.reporting.stats`) and Holm's adjustment over the family of variants at that budget
(uniform SnapKV is listed, outside the family). A variant beats (is worse than) the reference when its
Holm-adjusted p is below 0.05 and its difference is below (above) 0; its interval then excludes 0. With
``--cost`` (a ``benchmarks/profile_design_cost.py`` JSON) each variant's profiling cost ratio is listed and a variant
over the 1.5x bound is marked.

    python benchmarks/profile_design_fidelity.py benchmarks/results/profile-design/tune --reference default \\
        --cost benchmarks/results/profile-design/cost.json --json benchmarks/results/profile-design/fidelity.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ripplekv_eval.analysis.tuning_report import KL, SNAPKV, candidate_samples, comparison_record, macro_mean
from ripplekv_eval.reporting import stats
from ripplekv_eval.reporting.stats import ALPHA, DEFAULT_DRAWS, TEST_NAME, SignFlip, settle
from ripplekv_eval.running.results import ResultsLog

COST_BOUND = 1.5


def _end(value: float | None, unbounded: str) -> str:
    return unbounded if value is None else f"{value:+.4f}"


def variant_of(key: str) -> str:
    """The profile label of a tune candidate key ``label|r=..|gamma=..``."""
    return key.split("|", 1)[0]


def compare(rows: list[dict[str, Any]], reference: str, seed: int, draws: int = DEFAULT_DRAWS) -> list[dict[str, Any]]:
    """Per budget: each variant's mean KL and its paired difference to ``reference`` (see the module docstring)."""
    keys = list(rows[0]["kl"])
    labels = [variant_of(k) for k in keys]
    if reference not in labels:
        raise SystemExit(f"no candidate of profile {reference!r} in the rows; profiles: {', '.join(labels)}")
    ref_key = keys[labels.index(reference)]
    flip = SignFlip(draws=draws, seed=seed)
    out = []
    for budget in sorted({float(r["budget"]) for r in rows}):
        at = [r for r in rows if float(r["budget"]) == budget]
        values = {key: candidate_samples(at, None, key) for key in [*keys, SNAPKV]}
        others = [key for key in values if key != ref_key]
        pairs = [(key, ref_key, values[key], values[ref_key]) for key in others]
        tested = dict(zip(others, stats.compare(KL, pairs, flip)))
        family = [key for key in others if key != SNAPKV]  # Holm over the variants; SnapKV listed outside
        tested.update(zip(family, settle([tested[key] for key in family], ALPHA)))
        entries = []
        for key, samples in values.items():
            entry: dict[str, Any] = {"variant": variant_of(key), "key": key, "kl": macro_mean(samples)}
            if key != ref_key:
                record = comparison_record(tested[key])
                significant = record.pop("significant")
                if key == SNAPKV:
                    record.pop("p_holm")
                entry.update(record)
                if key != SNAPKV:
                    entry["beats_reference"] = bool(significant and entry["difference"] < 0)
                    entry["worse_than_reference"] = bool(entry["p_holm"] < ALPHA and entry["difference"] > 0)
            entries.append(entry)
        out.append({"budget": budget, "prompts": len({r["sample_id"] for r in at}), "entries": entries})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tune", type=Path, help="a `ripplekv tune` output folder (its tune.jsonl)")
    parser.add_argument("--reference", default="default", help="the reference profile's label (default: default)")
    parser.add_argument("--cost", type=Path, default=None, help="a benchmarks/profile_design_cost.py JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--permutations", type=int, default=DEFAULT_DRAWS, help="random sign vectors per comparison")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    rows = ResultsLog(args.tune / "tune.jsonl").read()
    if not rows:
        raise SystemExit(f"{args.tune / 'tune.jsonl'} holds no rows")
    cost: dict[str, float] = {}
    if args.cost is not None:
        cost = {v["variant"]: float(v["ratio"]) for v in json.loads(args.cost.read_text())["variants"]}
    result = compare(rows, args.reference, args.seed, args.permutations)
    print(
        f"Test: {TEST_NAME} ({args.permutations} random sign vectors + the observed, seed {args.seed}); Holm over "
        "the variants at each budget (uniform SnapKV outside the family); better / worse: Holm p < 0.05."
    )
    for budget in result:
        print(f"\n## Budget {budget['budget']:g} ({budget['prompts']} held-out prompts)\n")
        print(f"| profile | mean KL | minus {args.reference} [95% CI] | W/T/L | Holm p | cost ratio |")
        print("|---|---:|---|---|---:|---:|")
        for e in budget["entries"]:
            name = e["variant"] if e["key"] != SNAPKV else "(uniform SnapKV)"
            ratio = cost.get(e["variant"].split("-b0p")[0])
            ratio_text = "" if ratio is None else f"{ratio:.2f}" + (" (over 1.5)" if ratio > COST_BOUND else "")
            if "difference" not in e:
                print(f"| **{name}** | {e['kl']:.4f} | reference | | | {ratio_text} |")
                continue
            verdict = " better" if e.get("beats_reference") else " worse" if e.get("worse_than_reference") else ""
            p_holm = f"{e['p_holm']:.3g}" if "p_holm" in e else f"{e['p']:.3g} (raw)"
            print(
                f"| {name} | {e['kl']:.4f} | {e['difference']:+.4f} "
                f"[{_end(e['low'], '-inf')}, {_end(e['high'], '+inf')}]{verdict} | "
                f"{e['wins']}/{e['ties']}/{e['losses']} | {p_holm} | {ratio_text} |"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "tune": str(args.tune),
                    "reference": args.reference,
                    "test": {
                        "name": TEST_NAME,
                        "draws": args.permutations,
                        "seed": args.seed,
                        "family": "the variants at one budget (uniform SnapKV outside)",
                        "adjustment": "holm",
                        "alpha": ALPHA,
                    },
                    "cost": cost,
                    "budgets": result,
                },
                indent=2,
                allow_nan=False,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
