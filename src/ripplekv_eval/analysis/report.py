"""The summary of ``ripplekv analyze``: does a predictor rank layers as their measured damage does?

Per budget: the mean damage per layer over prompts (95% percentile bootstrap interval over prompts) and, per
predictor (:data:`PREDICTORS`), Spearman's ``rho`` (``scipy.stats.spearmanr``'s: average ranks for ties; NaN when
either side is constant) of the mean damage with the mean predictor per layer, its interval from the same bootstrap
resamples of the prompts (resamples whose rho is undefined are counted and left out), each prompt's own rho, and
the top-k overlap with its chance level.
``depth``'s sign is the paper's (rho > 0: deeper layers do more damage); PyramidKV's budgets fall with depth, so its
rho is about minus depth's. Damage and predictors are ``(prompts, layers)`` float64 matrices (a fixed predictor
repeats one row).
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from scipy.stats import ConstantInputWarning, pearsonr, rankdata, spearmanr

from ripplekv.allocation.schedules import PyramidSchedule
from ripplekv.profiling.profile import SensitivityProfile
from ripplekv.validation import check_int
from ripplekv_eval.running.budget_rows import row_budget

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


def _checked(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.atleast_2d(np.asarray(x, dtype=np.float64)), np.atleast_2d(np.asarray(y, dtype=np.float64))
    if x.shape != y.shape or x.shape[-1] < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError(f"rank correlation needs at least 2 values per row, finite, same shapes: {x.shape}, {y.shape}")
    return x, y


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of ``x`` with the same row of ``y``, NaN where either is constant: what
    ``scipy.stats.spearmanr`` computes pair by pair (Pearson's r of the average ranks), for thousands of rows at once
    through ``scipy.stats.pearsonr`` of ``scipy.stats.rankdata``."""
    x, y = _checked(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)  # the rho of a constant row is NaN, counted as such
        return pearsonr(rankdata(x, axis=-1), rankdata(y, axis=-1), axis=-1).statistic


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """``scipy.stats.spearmanr`` of two vectors (NaN when either is constant)."""
    x, y = _checked(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)
        return float(spearmanr(x[0], y[0]).statistic)


class RhoEstimate(NamedTuple):
    """Rho of the per-layer means with its percentile interval and the resamples where it was undefined."""

    rho: float
    low: float
    high: float
    undefined: int


@dataclass(frozen=True, eq=False)
class PromptBootstrap:
    """The percentile bootstrap over prompts: ``weights`` ``(resamples, prompts)``, how often each prompt is drawn in
    each resample over ``prompts`` (``weights @ values`` is every resample's mean over the prompts); drawn once per
    budget, for the damage's intervals and every predictor's rho alike."""

    weights: np.ndarray
    confidence: float = 0.95

    @classmethod
    def draw(cls, prompts: int, resamples: int, seed: int, confidence: float = 0.95) -> PromptBootstrap:
        """``resamples`` resamples of ``prompts`` prompts; the draws depend only on the arguments."""
        draws = np.random.default_rng([seed, prompts]).integers(0, prompts, size=(resamples, prompts))
        offsets = (np.arange(resamples) * prompts)[:, None]
        counts = np.bincount((draws + offsets).ravel(), minlength=resamples * prompts).reshape(resamples, prompts)
        return cls(counts / float(prompts), confidence)

    def interval(self, replicates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The percentile interval of ``replicates`` (one per resample along axis 0)."""
        tail = 50.0 * (1.0 - self.confidence)
        low, high = np.percentile(replicates, [tail, 100.0 - tail], axis=0)
        return low, high

    def rho(self, damage: np.ndarray, predictor: np.ndarray) -> RhoEstimate:
        """Rho of the per-layer means of ``damage`` and ``predictor`` over prompts, with its interval."""
        rho = spearman(damage.mean(axis=0), predictor.mean(axis=0))
        replicates = spearman_rows(self.weights @ damage, self.weights @ predictor)
        defined = replicates[np.isfinite(replicates)]
        low, high = self.interval(defined) if defined.size else (math.nan, math.nan)
        return RhoEstimate(rho, float(low), float(high), int(replicates.size - defined.size))


def per_prompt_rho(damage: np.ndarray, predictor: np.ndarray) -> dict[str, Any]:
    """Each prompt's rho (NaN where undefined) with the median and quartiles of the defined ones."""
    values = spearman_rows(damage, predictor)
    defined = values[np.isfinite(values)]
    q1, median, q3 = np.percentile(defined, [25.0, 50.0, 75.0]) if defined.size else (math.nan,) * 3
    return {
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "defined": int(defined.size),
        "undefined": int(values.size - defined.size),
        "values": tuple(float(v) for v in values),
    }


def top_k_layers(values: Sequence[float] | np.ndarray, k: int) -> tuple[int, ...]:
    """The ``k`` layers with the largest values, largest first (ties: the shallower layer first)."""
    array = np.asarray(values, dtype=np.float64)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= array.size:
        raise ValueError(f"k must be an integer in [1, {array.size}] (the number of layers), got {k!r}")
    return tuple(sorted(range(array.size), key=lambda i: (-array[i], i))[:k])


def top_k_overlap(
    damage: Sequence[float] | np.ndarray, predictor: Sequence[float] | np.ndarray, k: int
) -> dict[str, Any]:
    """How many of the ``k`` most damaging layers are among the predictor's ``k`` largest; chance ``k * k / layers``."""
    first, second = top_k_layers(damage, k), top_k_layers(predictor, k)
    return {
        "k": k,
        "damage_layers": list(first),
        "predictor_layers": list(second),
        "overlap": len(set(first) & set(second)),
        "chance": k * k / np.asarray(damage).size,
    }


def _pyramid_shares(budget: float, window_size: int, layers: int, lengths: Sequence[int]) -> np.ndarray:
    schedule = PyramidSchedule(**row_budget(budget).kwargs(), window_size=window_size)
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
    bootstrap = PromptBootstrap.draw(len(rows), resamples, seed, confidence)
    low, high = bootstrap.interval(bootstrap.weights @ damage)
    mean = damage.mean(axis=0)
    correlations: dict[str, Any] = {}
    lengths = [int(row["compressed_tokens"]) for row in rows]
    for name, predictor in _predictors(profile, budget, window_size, layers, lengths).items():
        estimate = bootstrap.rho(damage, predictor)
        spread = per_prompt_rho(damage, predictor)
        correlations[name] = {
            "rho": _num(estimate.rho),
            "low": _num(estimate.low),
            "high": _num(estimate.high),
            "undefined_resamples": estimate.undefined,
            "per_prompt": {
                **{key: _num(spread[key]) for key in ("median", "q1", "q3")},
                "defined": spread["defined"],
                "undefined": spread["undefined"],
                "values": {str(row["sample_id"]): _num(v) for row, v in zip(rows, spread["values"])},
            },
            "top_k": top_k_overlap(mean, predictor.mean(axis=0), top_k),
            "paper": PAPER_RHO.get(name),
            "description": PREDICTOR_DESCRIPTIONS[name],
        }
    return {
        "budget": budget,
        "prompts": len(rows),
        "tasks": dict(Counter(str(row["task"]) for row in rows)),
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
    """The analysis summary of damage rows (see the module docstring), as a JSON-ready dict."""
    if not rows:
        raise ValueError("no damage rows to summarise")
    check_int("top_k", top_k)
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
