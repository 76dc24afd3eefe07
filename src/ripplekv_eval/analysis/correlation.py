"""Rank agreement between measured per-layer damage and a per-layer predictor (a profile, depth, a schedule).

Every function takes a ``(prompts, layers)`` matrix of damage (one row per prompt: the fidelity loss of compressing
each layer alone) and a predictor matrix of the same shape (a fixed predictor, such as a profile's scores or the
layer index, repeats one row; a per-prompt one, such as PyramidKV's budgets for each prompt's length, has its own).

- :func:`spearman`: Spearman's rank correlation (Pearson's correlation of the average ranks, so ties are handled
  as ``scipy.stats.spearmanr`` handles them), NaN when either side is constant.
- :func:`bootstrap_rho`: rho of the mean damage per layer with the mean predictor per layer, and its percentile
  bootstrap interval over prompts: every resample draws prompts with replacement, recomputes both means and their
  rho. Resamples whose rho is undefined (a constant mean) are counted and left out of the percentiles.
- :func:`per_prompt_rho`: each prompt's own rho, summarised by its median and quartiles.
- :func:`top_k_overlap`: how many of the ``k`` most damaging layers are among the predictor's ``k`` largest.

Everything is computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

__all__ = [
    "RhoDistribution",
    "RhoEstimate",
    "TopK",
    "bootstrap_rho",
    "check_matrices",
    "per_prompt_rho",
    "resample_weights",
    "spearman",
    "spearman_rows",
    "top_k_layers",
    "top_k_overlap",
]


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of ``x`` with the same row of ``y`` (NaN for a row where either is constant).

    Args:
        x: ``(rows, n)`` values (or one ``(n,)`` vector).
        y: the same shape.
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    if x.shape != y.shape:
        raise ValueError(f"rank correlation of arrays of shapes {x.shape} and {y.shape}")
    if x.shape[-1] < 2:
        raise ValueError(f"rank correlation needs at least 2 values per row, got {x.shape[-1]}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("rank correlation of non-finite values")
    rx = rankdata(x, axis=-1)
    ry = rankdata(y, axis=-1)
    rx -= rx.mean(axis=-1, keepdims=True)
    ry -= ry.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((rx * rx).sum(axis=-1) * (ry * ry).sum(axis=-1))
    numerator = (rx * ry).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.nan)
    return np.clip(rho, -1.0, 1.0)


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation of two vectors (average ranks for ties); NaN when either is constant.

    Args:
        x: the first vector (at least 2 values).
        y: the second vector, same length.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"spearman takes two vectors, got shapes {x.shape} and {y.shape}")
    return float(spearman_rows(x, y)[0])


def check_matrices(damage: np.ndarray, predictor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as float64 ``(prompts, layers)`` arrays, checked (same shape, >= 1 prompt, >= 2 layers, finite).

    Args:
        damage: per-prompt damage per layer.
        predictor: per-prompt predictor per layer.
    """
    damage = np.asarray(damage, dtype=np.float64)
    predictor = np.asarray(predictor, dtype=np.float64)
    if damage.ndim != 2 or damage.shape[0] < 1 or damage.shape[1] < 2:
        raise ValueError(f"damage must be a (prompts >= 1, layers >= 2) matrix, got shape {damage.shape}")
    if predictor.shape != damage.shape:
        raise ValueError(f"predictor of shape {predictor.shape} does not match damage of shape {damage.shape}")
    if not (np.isfinite(damage).all() and np.isfinite(predictor).all()):
        raise ValueError("damage and predictor must be finite")
    return damage, predictor


@dataclass(frozen=True)
class RhoEstimate:
    """Rho of the mean damage per layer with the mean predictor per layer, and its bootstrap interval.

    Args:
        rho: the point estimate (NaN when undefined).
        low: lower end of the percentile interval (NaN when every resample is undefined).
        high: upper end.
        resamples: bootstrap resamples drawn.
        undefined: resamples whose rho was undefined (left out of the percentiles).
        confidence: the interval's level.
    """

    rho: float
    low: float
    high: float
    resamples: int
    undefined: int
    confidence: float


def _check_bootstrap(resamples: int, seed: int, confidence: float) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not (isinstance(confidence, float) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be a float in (0, 1), got {confidence!r}")


def resample_weights(prompts: int, resamples: int, seed: int) -> np.ndarray:
    """``(resamples, prompts)``: how often each prompt is drawn (with replacement) in each resample, over ``prompts``.

    ``weights @ values`` is every resample's mean at once. The draws depend only on the arguments.

    Args:
        prompts: number of prompts (>= 1).
        resamples: number of resamples (>= 1).
        seed: non-negative seed.
    """
    _check_bootstrap(resamples, seed, 0.5)
    if isinstance(prompts, bool) or not isinstance(prompts, int) or prompts < 1:
        raise ValueError(f"prompts must be an integer >= 1, got {prompts!r}")
    draws = np.random.default_rng([seed, prompts]).integers(0, prompts, size=(resamples, prompts))
    offsets = (np.arange(resamples) * prompts)[:, None]
    counts = np.bincount((draws + offsets).ravel(), minlength=resamples * prompts).reshape(resamples, prompts)
    return counts / float(prompts)


def bootstrap_rho(
    damage: np.ndarray, predictor: np.ndarray, resamples: int = 4000, seed: int = 0, confidence: float = 0.95
) -> RhoEstimate:
    """Rho of the per-layer means of ``damage`` and ``predictor`` over prompts, with a percentile bootstrap interval.

    The resampled prompts depend only on ``seed``, ``resamples`` and the number of prompts, so several predictors
    bootstrapped over the same damage see the same resamples.

    Args:
        damage: ``(prompts, layers)`` damage.
        predictor: ``(prompts, layers)`` predictor (rows repeated for a fixed one).
        resamples: number of bootstrap resamples (>= 1).
        seed: non-negative seed of the draws.
        confidence: two-sided interval level in (0, 1).
    """
    damage, predictor = check_matrices(damage, predictor)
    _check_bootstrap(resamples, seed, confidence)
    rho = spearman(damage.mean(axis=0), predictor.mean(axis=0))
    weights = resample_weights(damage.shape[0], resamples, seed)
    replicates = spearman_rows(weights @ damage, weights @ predictor)
    defined = replicates[np.isfinite(replicates)]
    tail = 50.0 * (1.0 - confidence)
    low, high = np.percentile(defined, [tail, 100.0 - tail]) if defined.size else (math.nan, math.nan)
    return RhoEstimate(rho, float(low), float(high), resamples, int(replicates.size - defined.size), confidence)


@dataclass(frozen=True)
class RhoDistribution:
    """The distribution of per-prompt rhos.

    Args:
        median: median of the defined rhos (NaN when none is).
        q1: first quartile.
        q3: third quartile.
        defined: prompts whose rho is defined.
        undefined: prompts whose rho is undefined (constant damage or predictor).
        values: every prompt's rho (NaN where undefined), in prompt order.
    """

    median: float
    q1: float
    q3: float
    defined: int
    undefined: int
    values: tuple[float, ...]


def per_prompt_rho(damage: np.ndarray, predictor: np.ndarray) -> RhoDistribution:
    """Each prompt's rho of its damage with its predictor row, with median and quartiles.

    Args:
        damage: ``(prompts, layers)`` damage.
        predictor: ``(prompts, layers)`` predictor.
    """
    damage, predictor = check_matrices(damage, predictor)
    values = spearman_rows(damage, predictor)
    defined = values[np.isfinite(values)]
    if defined.size:
        q1, median, q3 = (float(v) for v in np.percentile(defined, [25.0, 50.0, 75.0]))
    else:
        q1 = median = q3 = math.nan
    return RhoDistribution(
        median, q1, q3, int(defined.size), int(values.size - defined.size), tuple(float(v) for v in values)
    )


def top_k_layers(values: Sequence[float] | np.ndarray, k: int) -> tuple[int, ...]:
    """The ``k`` layers with the largest values, largest first (ties: the shallower layer first).

    Args:
        values: one value per layer.
        k: how many (1 to the number of layers).
    """
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"values must be a vector, got shape {array.shape}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= array.size:
        raise ValueError(f"k must be an integer in [1, {array.size}] (the number of layers), got {k!r}")
    order = sorted(range(array.size), key=lambda i: (-array[i], i))
    return tuple(order[:k])


@dataclass(frozen=True)
class TopK:
    """Overlap of the ``k`` most damaging layers with the predictor's ``k`` largest.

    Args:
        k: how many layers.
        damage_layers: the ``k`` layers of largest mean damage, largest first.
        predictor_layers: the ``k`` layers of largest mean predictor, largest first.
        overlap: how many layers the two sets share.
        chance: the overlap expected of a random predictor, ``k * k / layers``.
    """

    k: int
    damage_layers: tuple[int, ...]
    predictor_layers: tuple[int, ...]
    overlap: int
    chance: float


def top_k_overlap(damage: Sequence[float] | np.ndarray, predictor: Sequence[float] | np.ndarray, k: int) -> TopK:
    """Overlap of the top-``k`` layers of ``damage`` and of ``predictor`` (per-layer vectors, e.g. means).

    Args:
        damage: damage per layer.
        predictor: predictor per layer (same length).
        k: how many layers (1 to the number of layers).
    """
    damage = np.asarray(damage, dtype=np.float64)
    predictor = np.asarray(predictor, dtype=np.float64)
    if damage.shape != predictor.shape:
        raise ValueError(f"damage of shape {damage.shape} and predictor of shape {predictor.shape} differ")
    first, second = top_k_layers(damage, k), top_k_layers(predictor, k)
    return TopK(k, first, second, len(set(first) & set(second)), k * k / damage.size)
