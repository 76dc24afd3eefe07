"""The RippleKV rule (RippleKV paper, 2026): per-layer sensitivity scores to per-layer KV-cache budgets.

1. min-max normalise the scores ``s`` to ``[0, 1]`` (all-equal scores normalise to 0, i.e. uniform);
2. map each normalised score to a multiplier ``w_l = ratio ** s_l`` (``ratio``, the paper's ``r``, sets the
   disparity between the least and the most sensitive layer; ``ratio == 1`` is uniform);
3. clip the multipliers to ``[1 / gamma, gamma]`` (``gamma >= 1``; ``gamma == 1`` is uniform);
4. rescale so that the integer per-layer budgets sum to the global budget ``L * average``
   (:func:`~ripplekv.allocation.budget.scale_to_total`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ripplekv.allocation.budget import BudgetSpec, scale_to_total
from ripplekv.validation import is_integer, is_real

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GAMMA",
    "DEFAULT_RATIO",
    "Allocation",
    "AllocationConfig",
    "allocate",
    "layer_weights",
    "normalize_scores",
    "validate_scores",
]

DEFAULT_RATIO: float = 4.0
"""Default disparity ``r``: the most sensitive layer gets ``r`` times the least sensitive one's multiplier.

Chosen on a needle-retrieval grid over ``r`` and ``gamma``: docs/results.md, "Needle retrieval under compression,
and choosing r and gamma" (``benchmarks/results/needle_sweep.txt``).
"""

DEFAULT_GAMMA: float = 3.0
"""Default clip bound ``gamma``: multipliers are clipped to ``[1 / gamma, gamma]``.

Chosen with :data:`DEFAULT_RATIO` on the same grid (see there).
"""


@dataclass(frozen=True)
class AllocationConfig:
    """Hyper-parameters of the RippleKV allocation rule (RippleKV paper, 2026).

    Attributes:
        ratio: the base ``r`` of the multiplier ``w_l = r ** s_l`` applied to the min-max normalised
            sensitivity ``s_l``. Must be finite and ``> 0``. ``r > 1`` gives more cache to more sensitive
            layers, ``r == 1`` gives a uniform allocation and ``0 < r < 1`` inverts the ordering.
        gamma: the clip bound; multipliers are clipped to ``[1 / gamma, gamma]`` before rescaling, which
            bounds the ratio between any two real-valued (unrounded, not bound-limited) budgets by
            ``gamma ** 2``. Must be finite and ``>= 1``; ``gamma == 1`` gives a uniform allocation.
    """

    ratio: float = DEFAULT_RATIO
    gamma: float = DEFAULT_GAMMA

    def __post_init__(self) -> None:
        if not is_real(self.ratio) or not math.isfinite(self.ratio) or self.ratio <= 0:
            raise ValueError(f"AllocationConfig.ratio must be a finite number > 0, got {self.ratio!r}")
        if not is_real(self.gamma) or not math.isfinite(self.gamma) or self.gamma < 1:
            raise ValueError(f"AllocationConfig.gamma must be a finite number >= 1, got {self.gamma!r}")


DEFAULT_CONFIG = AllocationConfig()
"""The allocation configuration used when none is given (``DEFAULT_RATIO``, ``DEFAULT_GAMMA``)."""


def validate_scores(scores: Sequence[float]) -> np.ndarray:
    """``scores`` as a 1-D float64 array.

    Args:
        scores: one finite sensitivity score per layer.

    Raises:
        ValueError: if ``scores`` is empty, not one-dimensional, not numbers, or holds NaN / infinite values.
    """
    try:
        array = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"sensitivity scores must be a sequence of real numbers: {error}") from error
    if array.ndim != 1:
        raise ValueError(f"sensitivity scores must be one-dimensional (one per layer), got shape {array.shape}")
    if array.size == 0:
        raise ValueError("sensitivity scores are empty: need one score per layer (at least one layer)")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        layer = int(bad[0])
        value = array[layer]
        kind = "NaN" if np.isnan(value) else f"{value} (infinite)"
        raise ValueError(
            f"sensitivity score for layer {layer} is {kind}; all scores must be finite "
            f"(non-finite scores in layers {bad.tolist()})"
        )
    return array


def normalize_scores(scores: Sequence[float]) -> np.ndarray:
    """Min-max normalise per-layer sensitivity scores to ``[0, 1]`` (step 1 of the RippleKV rule, 2026).

    Args:
        scores: one finite sensitivity score per layer (higher = more sensitive to KV-cache compression).

    Returns:
        A float64 array ``(s - min) / (max - min)``; all zeros when every score is equal.

    Raises:
        ValueError: if ``scores`` is empty, not one-dimensional or contains NaN / infinite values.
    """
    array = validate_scores(scores)
    low = float(array.min())
    high = float(array.max())
    if high == low:
        return np.zeros_like(array)
    span = high - low
    # The span of two huge finite floats can overflow to inf; halving everything first keeps it finite.
    finite = math.isfinite(span)
    normalized = (array - low) / span if finite else (array / 2 - low / 2) / (high / 2 - low / 2)
    return np.clip(normalized, 0.0, 1.0)


def _weights_from_normalized(normalized: np.ndarray, config: AllocationConfig) -> np.ndarray:
    """Steps 2-3 of the RippleKV rule on already normalised scores."""
    weights = np.power(float(config.ratio), normalized)
    # ``pow`` is not guaranteed to be correctly rounded, so two nearly equal exponents could in principle give
    # weights in the wrong order by one ulp; a running extremum over the sorted exponents rules that out.
    order = np.argsort(normalized, kind="stable")
    accumulate = np.maximum.accumulate if config.ratio >= 1 else np.minimum.accumulate
    weights[order] = accumulate(weights[order])
    return np.clip(weights, 1.0 / float(config.gamma), float(config.gamma))


def layer_weights(scores: Sequence[float], config: AllocationConfig = DEFAULT_CONFIG) -> np.ndarray:
    """Per-layer budget multipliers of the RippleKV rule (paper, 2026), before rescaling.

    Args:
        scores: one finite sensitivity score per layer (higher = more sensitive).
        config: the disparity ``ratio`` and the clip bound ``gamma``.

    Returns:
        A float64 array ``clip(ratio ** normalize_scores(scores), 1 / gamma, gamma)``. Equal scores get equal
        weights, and for ``ratio >= 1`` the weights are non-decreasing in the scores.

    Raises:
        ValueError: if ``scores`` is empty, not one-dimensional or contains NaN / infinite values.
    """
    return _weights_from_normalized(normalize_scores(scores), config)


@dataclass(frozen=True)
class Allocation:
    """A RippleKV allocation (paper, 2026) with its intermediate quantities, as reported by the CLI.

    Attributes:
        scores: the per-layer sensitivity scores, as given.
        normalized: the min-max normalised scores in ``[0, 1]``.
        weights: the clipped multipliers ``clip(ratio ** normalized, 1 / gamma, gamma)``.
        budgets: the integer per-layer budgets (number of kept KV entries per layer).
        prompt_tokens: the prompt length the budgets were computed for (also the per-layer cap).
        average_budget: the average budget per layer (:meth:`BudgetSpec.average`).
        total: the global budget ``len(budgets) * average_budget`` (``== sum(budgets)``).
    """

    scores: tuple[float, ...]
    normalized: tuple[float, ...]
    weights: tuple[float, ...]
    budgets: tuple[int, ...]
    prompt_tokens: int
    average_budget: int
    total: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary of all fields (tuples become lists)."""
        return {
            "scores": list(self.scores),
            "normalized": list(self.normalized),
            "weights": list(self.weights),
            "budgets": list(self.budgets),
            "prompt_tokens": self.prompt_tokens,
            "average_budget": self.average_budget,
            "total": self.total,
        }


def allocate(
    scores: Sequence[float],
    budget: float | None = None,
    prompt_tokens: int | None = None,
    config: AllocationConfig = DEFAULT_CONFIG,
    min_tokens: int = 1,
    *,
    tokens: int | None = None,
) -> Allocation:
    """Integer per-layer KV-cache budgets by the RippleKV rule, with the quantities they came from.

    The global budget is ``B = L * average`` for ``L = len(scores)`` and ``average`` the budget's
    the budget's average (a kept fraction ``budget`` or a token count ``tokens``, exactly one of them).
    Each layer gets a real share ``x_l = clip(t * w_l, floor, prompt_tokens)`` of ``B`` with ``w`` from
    :func:`layer_weights` and ``t`` chosen so that ``sum(x) == B`` (water-filling: layers at a bound are fixed
    there and the excess or deficit is shared among the others in proportion to their weights). The shares are
    rounded by largest remainder (ties: larger weight, then higher score -- lower when ``ratio < 1`` --, then
    lower layer index), so the budgets

    * sum exactly to ``B``;
    * lie in ``[floor, prompt_tokens]`` with ``floor = min(min_tokens, prompt_tokens)``, lowered to ``B // L``
      when ``L * floor > B`` (a floor above the average cannot be met by every layer; ``B // L`` is the
      average, which is ``>= 1``, so no layer is ever left empty unless ``min_tokens == 0``);
    * are non-decreasing in the scores for ``ratio >= 1`` (non-increasing for ``ratio < 1``), even where
      clipping gives several layers the same weight; equal scores give budgets that differ by at most one;
    * are all equal to the average for equal scores, ``ratio == 1`` or ``gamma == 1``.

    Args:
        scores: one finite sensitivity score per layer (higher = more sensitive).
        budget: a kept fraction of the prompt in ``(0, 1]``; or None with ``tokens``.
        prompt_tokens: the number of prompt tokens (``>= 1``; required); also the per-layer cap.
        config: the disparity ``ratio`` and the clip bound ``gamma``.
        min_tokens: the requested minimum number of kept tokens per layer (``>= 0``), see ``floor`` above.
        tokens: instead of ``budget``, the average number of kept tokens per layer (an integer ``>= 1``).

    Returns:
        The :class:`Allocation`; its ``budgets`` are the ``L`` integer budgets.

    Raises:
        ValueError: on invalid scores, budget, prompt_tokens or min_tokens.
    """
    array = validate_scores(scores)
    normalized = normalize_scores(array)
    weights = _weights_from_normalized(normalized, config)
    # Rounding ties between equal weights (clipped to the same bound, or equal up to float rounding) go to the
    # higher score (lower for ratio < 1), so a strictly more sensitive layer never gets fewer tokens.
    preference = array if config.ratio >= 1 else -array
    if not is_integer(min_tokens) or min_tokens < 0:
        raise ValueError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
    if not is_integer(prompt_tokens) or prompt_tokens < 1:  # type: ignore[operator]
        raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
    average = BudgetSpec(budget, tokens).average(int(prompt_tokens))  # type: ignore[arg-type]
    total = len(weights) * average
    budgets = scale_to_total([float(w) for w in weights], total, int(min_tokens), int(prompt_tokens), preference)
    return Allocation(
        scores=tuple(float(s) for s in array),
        normalized=tuple(float(n) for n in normalized),
        weights=tuple(float(w) for w in weights),
        budgets=tuple(budgets),
        prompt_tokens=int(prompt_tokens),  # type: ignore[arg-type]
        average_budget=average,
        total=average * len(budgets),
    )
