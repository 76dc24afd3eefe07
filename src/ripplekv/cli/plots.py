"""Plots of a sensitivity profile and the per-layer budgets it gives."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path


def plot_profile_and_budgets(
    scores: Sequence[float],
    budgets: Mapping[str, Sequence[int]],
    path: str | os.PathLike[str],
    title: str = "",
    local_scores: Sequence[float] | None = None,
) -> Path:
    """Two stacked panels: per-layer sensitivity (top) and per-layer kept tokens per method (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = list(range(len(scores)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True, constrained_layout=True)
    top.bar(layers, scores, color="#3b6ea8", label="downstream KL (RippleKV)")
    top.set_ylabel("sensitivity s_l (KL)")
    if local_scores is not None:
        twin = top.twinx()
        twin.plot(layers, local_scores, color="#d08a2e", marker=".", label="local attention-output change")
        twin.set_ylabel("local signal", color="#d08a2e")
    top.set_title(title or "RippleKV sensitivity profile")
    top.legend(loc="upper left")
    for name, values in budgets.items():
        bottom.plot(layers, values, marker="o", markersize=3, label=name)
    bottom.set_xlabel("layer")
    bottom.set_ylabel("tokens kept")
    bottom.legend()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
