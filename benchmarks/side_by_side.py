"""Two or more models' verdicts side by side, each difference relative to the rival's mean so models whose KL
scales differ compare: RippleKV minus each family's representative over that representative's macro mean, with the
paired interval scaled the same way (bold: significant after Holm), from ``benchmarks/allocators_verdict.py``'s
``verdict.json``, SnapKV's scorer.

    python -m benchmarks.side_by_side \\
        "SmolLM2-135M, 211 prompts, 4K=benchmarks/results/allocators-longbench/verdict.json" \\
        "Qwen2.5-Coder-0.5B, 124 prompts, 2K=benchmarks/results/qwen2.5-coder-0.5b/longbench-default/verdict.json"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.headline_table import RIVAL_FAMILIES, SCORER

FAMILIES = (*RIVAL_FAMILIES, "local signal")


def relative_cells(verdict: dict[str, Any], metric: str) -> list[tuple[float, dict[str, dict[str, float]]]]:
    """Per budget, per family present: the difference, its interval and the rival's name, over the rival's mean."""
    out = []
    for entry in verdict["scorers"][SCORER]["metrics"][metric]["budgets"]:
        cells = {}
        for family in FAMILIES:
            c = entry["comparisons"].get(family)
            if c is None:
                continue
            mean = c["other_mean"]
            if mean == 0:
                raise SystemExit(f"{family} at {entry['budget']}: the rival's mean is 0, no relative difference")
            cells[family] = {
                "other": c["other"],
                "relative": c["difference"] / mean,
                "low": c["low"] / mean,
                "high": c["high"] / mean,
                "significant": c["p_holm"] < 0.05,
            }
        out.append((entry["budget"], cells))
    return out


def markdown(runs: list[tuple[str, dict[str, Any]]], metric: str) -> str:
    tables = [(label, relative_cells(verdict, metric)) for label, verdict in runs]
    present = [f for f in FAMILIES if any(f in cells for _, table in tables for _, cells in table)]
    head = f"| model | budget | {' | '.join(present)} |\n|---|---|{'---|' * len(present)}\n"
    rows = []
    for label, table in tables:
        for budget, cells in table:
            text = [_cell(cells[f]) if f in cells else "" for f in present]
            rows.append(f"| {label} | {budget:.0%} | {' | '.join(text)} |\n")
    return head + "".join(rows)


def _cell(c: dict[str, Any]) -> str:
    bold = "**" if c["significant"] else ""
    return f"{c['other'].split(':')[0]} {bold}{c['relative']:+.0%}{bold} [{c['low']:+.0%}, {c['high']:+.0%}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=PATH of a verdict.json, in the table's order")
    parser.add_argument("--metric", default="fidelity_kl", help="the verdicts' metric (default fidelity_kl)")
    args = parser.parse_args(argv)
    runs = []
    for spec in args.runs:
        label, sep, path = spec.rpartition("=")
        if not sep or not label:
            raise SystemExit(f"expected LABEL=PATH, got {spec!r}")
        runs.append((label, json.loads(Path(path).read_text())))
    print(markdown(runs, args.metric), end="")


if __name__ == "__main__":
    main()
