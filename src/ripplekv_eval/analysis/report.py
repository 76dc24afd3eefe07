"""The summary of ``ripplekv analyze``: does a predictor rank layers as their measured damage does?

Per budget: the mean damage per layer over prompts (95% bootstrap interval) and, per predictor (:data:`PREDICTORS`),
Spearman's ``rho`` of mean damage with mean predictor per layer (bootstrap interval over prompts), each prompt's
own rho, and the top-k overlap with its chance level. ``depth``'s sign is the paper's (rho > 0: deeper layers do
more damage); PyramidKV's budgets fall with depth, so its rho is about minus depth's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.allocation.schedules import PyramidSchedule
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv_eval.analysis.correlation import (
    bootstrap_rho,
    per_prompt_rho,
    resample_weights,
    top_k_layers,
    top_k_overlap,
)

__all__ = ["PAPER_RHO", "PREDICTORS", "PREDICTOR_DESCRIPTIONS", "SUMMARY_FORMAT", "summarize", "to_markdown"]

SUMMARY_FORMAT = "ripplekv-analysis/1"
PREDICTORS = ("profile_kl", "profile_local", "depth", "pyramidkv")
PREDICTOR_DESCRIPTIONS = {
    "profile_kl": "the profile's downstream-KL scores (what ripplekv allocates from)",
    "profile_local": "the profile's local signal, the attention-output change (what ripplekv-local allocates from)",
    "depth": "the layer index: rho > 0 when deeper layers do more damage (the paper's 0.359 is read with this sign)",
    "pyramidkv": "PyramidKV's budget shares for each prompt's length: rho > 0 when it gives more to damaging layers",
}
PAPER_RHO = {"profile_kl": 0.799, "depth": 0.359}
"""The paper's averaged rho of sensitivity (and of depth) with the real damage of compressing a layer."""


def _num(value: float) -> float | None:
    """``value`` as a JSON number, None for NaN."""
    return None if not math.isfinite(value) else float(value)


def _pyramid_shares(budget: float, window_size: int, layers: int, lengths: Sequence[int]) -> np.ndarray:
    schedule = PyramidSchedule(**BudgetSpec.from_value(budget).kwargs(), window_size=window_size)
    rows = []
    for length in lengths:
        budgets = np.array(schedule.layer_budgets(layers, int(length), max(1, window_size)), dtype=np.float64)
        rows.append(budgets / budgets.sum())
    return np.array(rows)


def _predictors(
    profile: SensitivityProfile | None, budget: float, window_size: int, layers: int, lengths: Sequence[int]
) -> dict[str, np.ndarray]:
    prompts = len(lengths)
    found: dict[str, np.ndarray] = {}
    if profile is not None:
        if profile.num_layers != layers:
            raise ValueError(f"the profile has {profile.num_layers} layers, the damage rows {layers}")
        found["profile_kl"] = np.tile(np.array(profile.scores, dtype=np.float64), (prompts, 1))
        found["profile_local"] = np.tile(np.array(profile.local_scores, dtype=np.float64), (prompts, 1))
    found["depth"] = np.tile(np.arange(layers, dtype=np.float64), (prompts, 1))
    found["pyramidkv"] = _pyramid_shares(budget, window_size, layers, lengths)
    return found


def _rows_by_budget(rows: Sequence[Mapping[str, Any]]) -> dict[float, list[Mapping[str, Any]]]:
    grouped: dict[float, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(float(row["budget"]), {})[str(row["sample_id"])] = row  # a repeated row: the last wins
    return {budget: list(by_id.values()) for budget, by_id in sorted(grouped.items())}


def _budget_summary(
    rows: Sequence[Mapping[str, Any]],
    budget: float,
    profile: SensitivityProfile | None,
    window_size: int,
    top_k: int,
    resamples: int,
    seed: int,
    confidence: float,
) -> dict[str, Any]:
    damage = np.array([row["damage_kl"] for row in rows], dtype=np.float64)
    if damage.ndim != 2 or damage.shape[1] < 2:
        raise ValueError(f"budget {budget:g}: damage rows must hold one value for each of >= 2 layers")
    layers = damage.shape[1]
    if top_k > layers:
        raise ValueError(f"top_k {top_k} is more than the model's {layers} layers")
    top1 = np.array([row["damage_top1"] for row in rows], dtype=np.float64)
    weights = resample_weights(len(rows), resamples, seed)
    tail = 50.0 * (1.0 - confidence)
    low, high = np.percentile(weights @ damage, [tail, 100.0 - tail], axis=0)
    mean = damage.mean(axis=0)
    tasks: dict[str, int] = {}
    for row in rows:
        tasks[str(row["task"])] = tasks.get(str(row["task"]), 0) + 1
    correlations: dict[str, Any] = {}
    lengths = [int(row["compressed_tokens"]) for row in rows]
    for name, predictor in _predictors(profile, budget, window_size, layers, lengths).items():
        estimate = bootstrap_rho(damage, predictor, resamples, seed, confidence)
        spread = per_prompt_rho(damage, predictor)
        overlap = top_k_overlap(mean, predictor.mean(axis=0), top_k)
        correlations[name] = {
            "rho": _num(estimate.rho),
            "low": _num(estimate.low),
            "high": _num(estimate.high),
            "undefined_resamples": estimate.undefined,
            "per_prompt": {
                "median": _num(spread.median),
                "q1": _num(spread.q1),
                "q3": _num(spread.q3),
                "defined": spread.defined,
                "undefined": spread.undefined,
                "values": {str(row["sample_id"]): _num(v) for row, v in zip(rows, spread.values)},
            },
            "top_k": {
                "k": overlap.k,
                "damage_layers": list(overlap.damage_layers),
                "predictor_layers": list(overlap.predictor_layers),
                "overlap": overlap.overlap,
                "chance": overlap.chance,
            },
            "paper": PAPER_RHO.get(name),
            "description": PREDICTOR_DESCRIPTIONS[name],
        }
    return {
        "budget": budget,
        "prompts": len(rows),
        "tasks": tasks,
        "mean_damage": [float(v) for v in mean],
        "damage_low": [float(v) for v in low],
        "damage_high": [float(v) for v in high],
        "mean_top1": [float(v) for v in top1.mean(axis=0)],
        "damage_sum": math.fsum(float(v) for v in mean),
        "uniform_kl": math.fsum(float(row["uniform_kl"]) for row in rows) / len(rows),
        "uniform_top1": math.fsum(float(row["uniform_top1"]) for row in rows) / len(rows),
        "kept_tokens_mean": math.fsum(float(row["kept_tokens"]) for row in rows) / len(rows),
        "compressed_tokens_mean": math.fsum(float(n) for n in lengths) / len(rows),
        "answer_tokens_mean": math.fsum(float(row["answer_tokens"]) for row in rows) / len(rows),
        "damage_top_layers": list(top_k_layers(mean, top_k)),
        "correlations": correlations,
    }


def summarize(
    rows: Sequence[Mapping[str, Any]],
    profile: SensitivityProfile | None = None,
    window_size: int = 64,
    top_k: int = 5,
    resamples: int = 4000,
    seed: int = 0,
    confidence: float = 0.95,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The analysis summary of damage rows (see the module docstring), as a JSON-ready dict.

    Args:
        rows: damage rows (``damage.jsonl``), in prompt order; a (prompt, budget) given twice counts once.
        profile: the sensitivity profile whose scores are compared (None: depth and PyramidKV only).
        window_size: SnapKV's window (PyramidKV's schedule depends on it).
        top_k: how many top layers to compare (1 to the number of layers).
        confidence: interval level in (0, 1).
        context: copied into the summary (model, suite, files, ...).
    """
    if not rows:
        raise ValueError("no damage rows to summarise")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    budgets = {
        f"{budget:g}": _budget_summary(group, budget, profile, window_size, top_k, resamples, seed, confidence)
        for budget, group in _rows_by_budget(rows).items()
    }
    profile_info = None
    if profile is not None:
        profile_info = {
            "model": profile.model.get("name_or_path"),
            "calibration": dict(profile.calibration),
            "scores": list(profile.scores),
            "local_scores": list(profile.local_scores),
            "kind": profile.extra.get("kind", "sensitivity"),
        }
    return {
        "format": SUMMARY_FORMAT,
        **dict(context or {}),
        "damage": "mean KL(full || only this layer compressed by SnapKV at the budget), nats per token of the full "
        "cache's greedy answer, teacher-forced (as fidelity_kl in ripplekv eval)",
        "statistics": {
            "rho": "Spearman (average ranks for ties) of the mean damage per layer with the mean predictor per layer",
            "interval": f"{confidence:.0%} percentile bootstrap over prompts",
            "resamples": resamples,
            "seed": seed,
            "confidence": confidence,
            "top_k": top_k,
            "depth_sign": PREDICTOR_DESCRIPTIONS["depth"],
            "paper": PAPER_RHO,
        },
        "profile": profile_info,
        "budgets": budgets,
    }


def _fmt(value: float | None) -> str:
    """A rho with its sign and 3 decimals; ``n/a`` when undefined."""
    return "n/a" if value is None else f"{value:+.3f}"


def to_markdown(summary: Mapping[str, Any]) -> str:
    """:func:`summarize`'s summary as Markdown tables: rho per predictor and budget, then the damage per layer."""
    stats = summary["statistics"]
    lines = [f"# Per-layer damage: {summary.get('model', '?')} on {summary.get('suite', '?')}", ""]
    lines.append(f"Damage: {summary['damage']}.")
    lines.append(
        f"rho: {stats['rho']}; {stats['interval']} ({stats['resamples']} resamples, seed {stats['seed']}); per prompt: "
        f"median [quartiles] of each prompt's own rho; top-{stats['top_k']}: shared layers among the "
        f"{stats['top_k']} most damaging and the predictor's {stats['top_k']} largest (chance: k*k/layers)."
    )
    lines.append(f"Depth sign: {stats['depth_sign']}.")
    profile = summary.get("profile")
    if profile is not None:
        calibration = profile["calibration"].get("description", profile["calibration"])
        lines.append(f"Profile ({profile['kind']}) calibration: {calibration}.")
    for key, entry in summary["budgets"].items():
        k = stats["top_k"]
        lines += [
            "",
            f"## Budget {key}: {entry['prompts']} prompts, {entry['kept_tokens_mean']:.0f} of "
            f"{entry['compressed_tokens_mean']:.0f} tokens kept in the compressed layer on average",
            "",
            f"All layers compressed (SnapKV): mean KL {entry['uniform_kl']:.4f}; sum of the single-layer damages "
            f"{entry['damage_sum']:.4f}.",
            "",
            f"| predictor | rho | 95% interval | per-prompt median [q1, q3] | top-{k} overlap | paper |",
            "|---|---:|---|---|---|---:|",
        ]
        for name, c in entry["correlations"].items():
            per = c["per_prompt"]
            top = c["top_k"]
            paper = "" if c["paper"] is None else f"{c['paper']:.3f}"
            lines.append(
                f"| {name} | {_fmt(c['rho'])} | [{_fmt(c['low'])}, {_fmt(c['high'])}] | {_fmt(per['median'])} "
                f"[{_fmt(per['q1'])}, {_fmt(per['q3'])}] | {top['overlap']}/{k} (chance {top['chance']:.2f}) | "
                f"{paper} |"
            )
        mean = entry["mean_damage"]
        top_layers = ", ".join(f"{i} ({mean[i]:.4g})" for i in entry["damage_top_layers"])
        lines += ["", f"Most damaging layers: {top_layers}."]
        for name, c in entry["correlations"].items():
            lines.append(f"- {name}'s top {k}: {', '.join(str(i) for i in c['top_k']['predictor_layers'])}")
    budgets = list(summary["budgets"])
    layers = len(next(iter(summary["budgets"].values()))["mean_damage"])
    lines += ["", "## Mean damage per layer (nats per token)", ""]
    lines.append("| layer | " + " | ".join(f"budget {b}" for b in budgets) + " |")
    lines.append("|---:|" + "---:|" * len(budgets))
    for layer in range(layers):
        cells = [f"{summary['budgets'][b]['mean_damage'][layer]:.4g}" for b in budgets]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
