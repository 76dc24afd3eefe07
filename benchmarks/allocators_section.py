"""The results-page section of one allocator run of issue 17, from its ``report.md`` and ``verdict.json``/``.md``.

Prints markdown for ``docs/results.md``: the commands, the allocation x scorer matrices of ``fidelity_kl`` (each
budget's table of the report, with its intervals), the report's per-scorer lines (RippleKV's paired difference to
the best other schedule), the thesis lines and the per-family tables of ``benchmarks/allocators_verdict.py``; then,
after a ``---README---`` line, one line per budget with each scorer's thesis verdict (for the README's verdict).
Run ``ripplekv report RUN > RUN/report.md`` and ``allocators_verdict.py RUN --json RUN/verdict.json --md
RUN/verdict.md`` first. Nothing is computed here: every number is copied from those files.

    python benchmarks/allocators_section.py benchmarks/results/allocators-longbench \\
        --title "Every allocation family at SnapKV's total: ..." --description "The 211 prompts ..., {rows} rows; ..."
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

METRIC = "fidelity_kl"


def _matrices(report: list[str]) -> tuple[list[str], list[str]]:
    """The report's per-scorer lines of the metric and its allocation x scorer tables (headings one level down).

    A run of one scorer has no allocation x scorer section: its table of the metric's means stands for it.
    """
    if "## Allocation x scorer" not in report:
        start = next(i for i, line in enumerate(report) if line.startswith(f"## {METRIC} "))
        end = next((i for i in range(start + 1, len(report)) if report[i].startswith(("## ", "### "))), len(report))
        return [], ["#" + report[start], *report[start + 1 : end]]  # the means, not the paired subsections
    start = report.index("## Allocation x scorer")
    end = next((i for i in range(start + 1, len(report)) if report[i].startswith("## ")), len(report))
    part = report[start + 1 : end]
    first = next(i for i, line in enumerate(part) if line.startswith("### "))
    intro = [line for line in part[:first] if not (line.startswith("- budget") and f"({METRIC})" not in line)]
    tables: list[str] = []
    keep = True
    for line in part[first:]:
        if line.startswith("### "):
            keep = line.startswith(f"### {METRIC}")
        if keep:
            tables.append("#" + line if line.startswith("### ") else line)
    return intro, tables


def _verdict_parts(verdict: list[str], scorers: list[str]) -> list[str]:
    """The thesis lines of the metric and its per-scorer tables (headings one level down)."""
    start = next(i for i, line in enumerate(verdict) if line.startswith(f"**Thesis ({METRIC})**"))
    end = next(
        (i for i in range(start + 1, len(verdict)) if verdict[i].startswith(("**Thesis (", "### "))), len(verdict)
    )
    out = verdict[start:end]
    for scorer in scorers:
        head = next((i for i, line in enumerate(verdict) if line.startswith(f"### {METRIC}, scorer {scorer} ")), None)
        if head is None:
            continue
        stop = next((i for i in range(head + 1, len(verdict)) if verdict[i].startswith("### ")), len(verdict))
        out += ["#" + verdict[head], *verdict[head + 1 : stop]]
    return out


def section(run: Path, title: str, description: str) -> tuple[str, list[str]]:
    """The markdown section and the README lines (one per budget).

    Args:
        run: the evaluation folder (with report.md, verdict.json, verdict.md, results.jsonl).
        title: the section's heading.
        description: what ran; ``{rows}`` is replaced by the row count.
    """
    intro, tables = _matrices((run / "report.md").read_text().splitlines())
    result: dict[str, Any] = json.loads((run / "verdict.json").read_text())
    scorers = list(result["scorers"])
    with (run / "results.jsonl").open() as handle:
        rows = sum(1 for line in handle if line.strip())
    name = run.name
    lines = [
        f"### {title}",
        "",
        f"`bash benchmarks/results/{name}/COMMAND.sh`, then `ripplekv report benchmarks/results/{name}`",
        f"([report](../benchmarks/results/{name}/report.md), [JSON](../benchmarks/results/{name}/report.json))",
        f"and `python benchmarks/allocators_verdict.py benchmarks/results/{name} --json "
        f"benchmarks/results/{name}/verdict.json --md benchmarks/results/{name}/verdict.md`",
        f"([verdict](../benchmarks/results/{name}/verdict.md)).",
        description.replace("{rows}", f"{rows:,}"),
        "",
        "Allocation x scorer (mean KL(full || method), nats per answer token, 95% stratified BCa interval; the "
        "report's matrices):",
        "",
        *tables,
        "",
        *intro,
        "",
        "RippleKV against one representative of each family over the same scorer and prompts (`ripplekv - other`, "
        "paired; the attention-statistics representative is the best of cake, dynamickv and lava at that budget; "
        "Holm over the five comparisons of one scorer, budget and metric):",
        "",
        *_verdict_parts((run / "verdict.md").read_text().splitlines(), scorers),
    ]
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    readme = []
    budgets = result["scorers"][scorers[0]]["metrics"][METRIC]["budgets"]
    for entry in budgets:
        parts = []
        for scorer in scorers:
            per_budget = result["scorers"][scorer]["metrics"][METRIC]["budgets"]
            found = [b for b in per_budget if b["budget"] == entry["budget"]]
            parts.append(f"{scorer} {found[0]['thesis']}")
        readme.append(f"{100 * entry['budget']:g}%: " + "; ".join(parts))
    return text.rstrip(), readme


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the evaluation folder")
    parser.add_argument("--title", required=True, help="the section's heading")
    parser.add_argument("--description", required=True, help="what ran ({rows}: the row count)")
    args = parser.parse_args()
    text, readme = section(args.run, args.title, args.description)
    print(text)
    print("\n---README---")
    print("\n".join(readme))


if __name__ == "__main__":
    main()
