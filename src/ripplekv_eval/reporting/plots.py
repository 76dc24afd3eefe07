"""Plots of ``ripplekv report`` (matplotlib, Agg).

The average score against the budget per method (``score_vs_budget.png``); for LongBench and RULER a heatmap of
methods x tasks at each budget (``heatmap_budget_<b>.png``); for needles a heatmap over length x depth per method
and budget (``needle_<method>_budget_<b>.png``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ripplekv_eval.reporting.summary import RunSummary, needle_task
from ripplekv_eval.sample import FULL_BUDGET


def _budget_name(budget: float) -> str:
    return f"{budget:g}".replace(".", "p")


def write_plots(summary: RunSummary, directory: str | os.PathLike[str]) -> list[Path]:
    """Write the report's PNG plots into ``directory``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for method in summary.methods:
        if method == "full":
            full = summary.average.get(("full", FULL_BUDGET))
            if full is not None:
                ax.axhline(full, color="black", linestyle="--", linewidth=1, label="full")
            continue
        points = [(b, summary.average.get((method, b))) for b in summary.budgets]
        xs = [b for b, v in points if v is not None]
        ax.plot(xs, [v for _, v in points if v is not None], marker="o", label=method)
    ax.set_xlabel("budget (kept fraction, or tokens per layer)")
    ax.set_ylabel(f"average score over {len(summary.tasks)} tasks")
    ax.set_title(f"{summary.suite}: {summary.model}")
    ax.legend()
    save(fig, "score_vs_budget.png")

    if summary.suite != "needle":
        for budget in summary.budgets:
            grid = [
                [_nan(summary.value(t, m, budget)) for t in summary.tasks] for m in summary.methods
            ]  # rows: methods
            fig, ax = plt.subplots(
                figsize=(1.2 + 0.9 * len(summary.tasks), 1.0 + 0.5 * len(summary.methods)), constrained_layout=True
            )
            _heatmap(ax, grid, list(summary.methods), list(summary.tasks))
            ax.set_title(f"score per task at budget {budget:g} (full: budget 1)")
            plt.setp(ax.get_xticklabels(), rotation=40, ha="right")
            save(fig, f"heatmap_budget_{_budget_name(budget)}.png")
        return paths

    lengths = sorted({length for length, _ in summary.needle_cells.values()})
    depths = sorted({depth for _, depth in summary.needle_cells.values()})
    for method in summary.methods:
        for budget in [FULL_BUDGET] if method == "full" else summary.budgets:
            grid = [
                [_nan(summary.value(needle_task(length, depth), method, budget)) for depth in depths]
                for length in lengths
            ]
            fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(depths), 1.2 + 0.5 * len(lengths)), constrained_layout=True)
            _heatmap(ax, grid, [str(length) for length in lengths], [f"{d:g}" for d in depths])
            ax.set_xlabel("needle depth")
            ax.set_ylabel("context tokens")
            label = "full cache" if method == "full" else f"{method} at budget {budget:g}"
            ax.set_title(f"needle retrieval: {label}")
            name = "needle_full.png" if method == "full" else f"needle_{method}_budget_{_budget_name(budget)}.png"
            save(fig, name)
    return paths


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _heatmap(ax: Any, grid: list[list[float]], rows: list[str], columns: list[str]) -> None:
    image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(columns)), columns)
    ax.set_yticks(range(len(rows)), rows)
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if not math.isnan(value):
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", color="white" if value < 60 else "black")
    ax.figure.colorbar(image, ax=ax, fraction=0.05)
