"""Plots (matplotlib, Agg) of ``ripplekv report`` and ``ripplekv analyze``.

The report: average score against budget per method, and heatmaps of methods x tasks (needles: length x depth) per
budget. The analysis: mean damage per layer with its bootstrap band (and the profile's scores), and each layer's
damage against its profile scores, titled with rho.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ripplekv_eval.reporting.summary import RunSummary, needle_task
from ripplekv_eval.sample import FULL_BUDGET


def _figures(directory: str | os.PathLike[str]) -> tuple[Any, Callable[[Any, str], None], list[Path]]:
    """pyplot (Agg), a function saving a figure into ``directory`` (created) under a name, and the paths saved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)

    return plt, save, paths


def _budget_name(budget: float) -> str:
    return f"{budget:g}".replace(".", "p")


def write_plots(summary: RunSummary, directory: str | os.PathLike[str]) -> list[Path]:
    """Write the report's PNG plots into ``directory``; returns their paths."""
    plt, save, paths = _figures(directory)

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
            grid = [[_nan(summary.value(t, m, budget)) for t in summary.tasks] for m in summary.methods]
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


def _floor(values: list[float]) -> list[float]:
    """Values for a log axis: zeros and negatives (rounding) raised to a tenth of the smallest positive one."""
    positive = [v for v in values if v > 0]
    low = min(positive) / 10 if positive else 1e-12
    return [v if v > 0 else low for v in values]


def write_analysis_plots(summary: Mapping[str, Any], directory: str | os.PathLike[str]) -> list[Path]:
    """Write the plots of an analysis ``summary`` (:func:`ripplekv_eval.analysis.report.summarize`); their paths."""
    plt, save, paths = _figures(directory)
    from matplotlib.ticker import NullFormatter

    budgets: Mapping[str, Any] = summary["budgets"]
    profile = summary.get("profile")
    layers = list(range(len(next(iter(budgets.values()))["mean_damage"])))
    title = f"{summary.get('model', '')} on {summary.get('suite', '')}"

    panels = 2 if profile is not None else 1
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.4 * panels), sharex=True, constrained_layout=True, squeeze=False)
    top = axes[0][0]
    for key, entry in budgets.items():
        mean = _floor(entry["mean_damage"])
        top.plot(layers, mean, marker="o", markersize=3, label=f"budget {key} ({entry['prompts']} prompts)")
        top.fill_between(layers, _floor(entry["damage_low"]), _floor(entry["damage_high"]), alpha=0.2)
    top.set_yscale("log")
    top.set_ylabel("damage: KL (nats/token)")
    top.set_title(f"{title}: compressing one layer alone (SnapKV), 95% bootstrap band")
    top.legend()
    if profile is not None:
        bottom = axes[1][0]
        bottom.bar(layers, profile["scores"], color="#3b6ea8", label="profile KL score")
        bottom.set_ylabel("profile KL score")
        twin = bottom.twinx()
        twin.plot(layers, profile["local_scores"], color="#d08a2e", marker=".", label="local signal")
        twin.set_ylabel("local signal", color="#d08a2e")
        bottom.legend(loc="upper left")
    axes[-1][0].set_xlabel("layer")
    save(fig, "damage_per_layer.png")

    if profile is None:
        return paths
    for key, entry in budgets.items():
        fig, pair = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
        damage = _floor(entry["mean_damage"])
        for ax, name, label in (
            (pair[0], "profile_kl", "profile KL score"),
            (pair[1], "profile_local", "local signal"),
        ):
            scores = _floor(profile["scores" if name == "profile_kl" else "local_scores"])
            ax.scatter(scores, damage, s=18, color="#3b6ea8")
            for layer in layers:
                ax.annotate(
                    str(layer), (scores[layer], damage[layer]), fontsize=7, xytext=(2, 2), textcoords="offset points"
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap on a short log range
            ax.set_xlabel(label)
            ax.set_ylabel("mean damage (KL)")
            c = entry["correlations"][name]
            rho = "n/a" if c["rho"] is None else f"{c['rho']:+.3f}"
            low = "n/a" if c["low"] is None else f"{c['low']:+.2f}"
            high = "n/a" if c["high"] is None else f"{c['high']:+.2f}"
            ax.set_title(f"budget {key}: rho {rho} [{low}, {high}]")
        save(fig, f"damage_vs_profile_b{key.replace('.', 'p')}.png")
    return paths
