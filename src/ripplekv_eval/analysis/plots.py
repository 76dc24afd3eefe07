"""Plots of ``ripplekv analyze`` (matplotlib, Agg).

``damage_per_layer.png``: mean damage per layer per budget with its bootstrap band (log scale), and the profile's
KL and local scores below. ``damage_vs_profile_b<budget>.png`` (with a profile): each layer's mean damage against
its profile scores (log-log), titled with rho.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _budget_name(key: str) -> str:
    return key.replace(".", "p")


def _floor(values: list[float]) -> list[float]:
    """Values for a log axis: zeros and negatives (rounding) raised to a tenth of the smallest positive one."""
    positive = [v for v in values if v > 0]
    low = min(positive) / 10 if positive else 1e-12
    return [v if v > 0 else low for v in values]


def write_analysis_plots(summary: Mapping[str, Any], directory: str | os.PathLike[str]) -> list[Path]:
    """Write the plots of ``summary`` (:func:`ripplekv_eval.analysis.report.summarize`) into ``directory`` (created).

    Returns:
        The paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

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
        save(fig, f"damage_vs_profile_b{_budget_name(key)}.png")
    return paths
