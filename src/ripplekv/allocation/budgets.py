"""Per-layer KV-cache budget allocation (the RippleKV rule).

The RippleKV paper (2026) turns per-layer downstream-sensitivity scores into per-layer KV-cache budgets:

1. min-max normalise the scores ``s`` to ``[0, 1]`` (all-equal scores normalise to 0, i.e. uniform);
2. map each normalised score to a multiplier ``w_l = ratio ** s_l`` (``ratio`` sets the disparity between
   the least and the most sensitive layer; ``ratio == 1`` is uniform);
3. clip the multipliers to ``[1 / gamma, gamma]`` (``gamma >= 1``; ``gamma == 1`` is uniform);
4. rescale so that the per-layer budgets sum to the global budget ``B = L * average``.

A budget is given in one of two ways, never read from the size of one number: ``budget=`` a kept fraction of the
prompt in ``(0, 1]``, or ``tokens=`` an average number of kept tokens per layer (an integer ``>= 1``); see
:class:`BudgetSpec`.

:func:`allocate_budgets` does step 4 with integer budgets that sum exactly to ``B``, stay within
``[floor, prompt_tokens]`` and are proportional to the weights among the layers that are not at a bound.
All of step 4 is done in exact rational arithmetic, so the result is deterministic and platform-independent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ripplekv.allocation.apportion import scale_to_total
from ripplekv.validation import is_integer, is_real

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GAMMA",
    "DEFAULT_RATIO",
    "Allocation",
    "AllocationConfig",
    "BudgetSpec",
    "TokenBudgetError",
    "allocate",
    "allocate_budgets",
    "budget_value",
    "check_budget",
    "kept_ratio",
    "layer_weights",
    "normalize_scores",
    "resolve_average_budget",
    "scale_to_total",
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


class TokenBudgetError(ValueError):
    """``compression_ratio`` asked of a token budget, which has none without the prompt length.

    Use ``compression_ratio_for(prompt_tokens)``. A ``ValueError``, not an ``AttributeError``: ``getattr(press,
    "compression_ratio", default)`` does not silently swallow it.
    """


_BUDGET_RULE = "budget= is a kept fraction in (0, 1] (0.1 = 10%), tokens= an average token count per layer (>= 1)"


def _budget_problem(budget: object, tokens: object) -> str | None:
    """What is wrong with a ``(budget, tokens)`` pair, or None when exactly one of them is valid."""
    if budget is None and tokens is None:
        return f"no budget given: {_BUDGET_RULE}"
    if budget is not None and tokens is not None:
        return f"give budget= or tokens=, not both (got budget={budget!r}, tokens={tokens!r})"
    if budget is not None:
        if not is_real(budget):
            return f"budget must be a real number, a kept fraction in (0, 1]; got {budget!r}"
        value = float(budget)  # type: ignore[arg-type]
        if math.isnan(value):
            return "budget is NaN; it must be a kept fraction in (0, 1]"
        if math.isinf(value):
            return f"budget is {value} (infinite); it must be a kept fraction in (0, 1]"
        if value <= 0:
            return f"budget must be > 0 (a kept fraction in (0, 1]), got {budget!r}"
        if value > 1:
            hint = f"tokens={int(value)}" if math.isfinite(value) and value.is_integer() else "tokens=N (an integer)"
            return (
                f"budget={budget!r} is above 1, but budget is a kept fraction in (0, 1]; for an average number of "
                f"tokens kept per layer use {hint}"
            )
        return None
    if not is_integer(tokens):
        kind = "a bool" if isinstance(tokens, bool) else repr(tokens)
        return f"tokens must be an integer >= 1 (an average token count per layer), got {kind}"
    if tokens < 1:  # type: ignore[operator]
        return f"tokens must be >= 1 (an average token count per layer), got {tokens!r}"
    return None


def check_budget(budget: object = None, tokens: object = None, owner: str | None = None) -> BudgetSpec:
    """Validate a budget given as a kept fraction (``budget``) or as an average token count (``tokens``).

    Args:
        budget: kept fraction of the prompt, in ``(0, 1]``; None when ``tokens`` is given.
        tokens: average number of kept tokens per layer, an integer ``>= 1``; None when ``budget`` is given.
        owner: named at the start of the error message (e.g. ``"UniformSchedule"``).

    Returns:
        The :class:`BudgetSpec`.

    Raises:
        ValueError: unless exactly one of ``budget`` and ``tokens`` is given and valid; the message names the
            problem (a ``budget`` above 1 points to ``tokens=``).
    """
    problem = _budget_problem(budget, tokens)
    if problem is not None:
        raise ValueError(f"{owner}: {problem}" if owner else problem)
    return BudgetSpec(budget, tokens)  # type: ignore[arg-type]


def kept_ratio(kept: int, prompt_tokens: int) -> float:
    """The compression ratio that keeps ``kept`` of ``prompt_tokens`` tokens, as kvpress counts them.

    ``1 - kept / prompt_tokens``, moved by a few ulps where float rounding would otherwise make kvpress's
    ``int(prompt_tokens * (1 - ratio))`` (``kvpress.utils.compute_n_kept``) keep one token fewer or more: a
    kvpress press configured with this ratio keeps exactly ``kept`` tokens.

    Args:
        kept: tokens kept, in ``[1, prompt_tokens]``.
        prompt_tokens: tokens of the prompt (``>= 1``).

    Returns:
        A ratio in ``[0, 1)``; 0 when every token is kept.

    Raises:
        ValueError: if the counts are not integers in range.
    """
    if not is_integer(prompt_tokens) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
    if not is_integer(kept) or not 1 <= kept <= prompt_tokens:
        raise ValueError(f"kept must be an integer in [1, {prompt_tokens}], got {kept!r}")
    if kept == prompt_tokens:
        return 0.0
    ratio = 1.0 - int(kept) / int(prompt_tokens)
    for _ in range(64):
        counted = int(prompt_tokens * (1 - ratio))
        if counted == kept:
            return ratio
        ratio = math.nextafter(ratio, -math.inf if counted < kept else math.inf)
    raise AssertionError(f"no float ratio keeps {kept} of {prompt_tokens} tokens")  # pragma: no cover


@dataclass(frozen=True)
class BudgetSpec:
    """A KV-cache budget: a kept fraction of the prompt, or an average number of kept tokens per layer.

    Exactly one of the two is set, so ``1.0`` (keep everything) and ``tokens=1`` (one token per layer) can never
    be confused. Schedules and presses take the same two arguments (``budget=``, ``tokens=``) and build one.

    ``compression_ratio`` follows kvpress (the fraction removed) for a fraction only: ``1 - budget``. A token
    budget removes a fraction that depends on the prompt length, so its ``compression_ratio`` raises
    :class:`TokenBudgetError` rather than return a made-up number (or NaN, which kvpress arithmetic would carry
    on with); :meth:`compression_ratio_for` gives the ratio for a known prompt length, for both kinds.

    Attributes:
        budget: kept fraction of the prompt in ``(0, 1]`` (``0.1`` is 10%), or None.
        tokens: average kept tokens per layer (an integer ``>= 1``; at most the prompt is kept), or None.
    """

    budget: float | None = None
    tokens: int | None = None

    ROW_TOKENS_MIN: ClassVar[int] = 2
    """The smallest token count with a numeric row value (:attr:`value`): 1 would read back as the fraction 1.0."""

    def __post_init__(self) -> None:
        problem = _budget_problem(self.budget, self.tokens)
        if problem is not None:
            raise ValueError(problem)
        if self.budget is not None:
            object.__setattr__(self, "budget", float(self.budget))
        else:
            object.__setattr__(self, "tokens", int(self.tokens))  # type: ignore[arg-type]

    @property
    def is_tokens(self) -> bool:
        """True for a token count, False for a kept fraction."""
        return self.tokens is not None

    def average(self, prompt_tokens: int) -> int:
        """Kept KV entries per layer on average for a prompt of ``prompt_tokens`` tokens (``>= 1``).

        A fraction keeps ``max(1, int(prompt_tokens * (1 - (1 - budget))))``: exactly kvpress's
        ``int(k_len * (1 - compression_ratio))`` with ``compression_ratio = 1 - budget``, float rounding included
        (``1 - 0.9`` is ``0.09999999999999998``, so 10% of 100 tokens is 9, as in kvpress). A token count keeps
        ``min(tokens, prompt_tokens)``. The result is always in ``[1, prompt_tokens]``.

        Raises:
            ValueError: if ``prompt_tokens`` is not an integer ``>= 1``.
        """
        if not is_integer(prompt_tokens) or prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
        if self.tokens is not None:
            return min(self.tokens, int(prompt_tokens))
        # kvpress keeps int(k_len * (1 - compression_ratio)) with compression_ratio = 1 - budget; computing the
        # same float expression makes a uniform allocation keep exactly what kvpress's own press keeps.
        return max(1, int(prompt_tokens * (1.0 - (1.0 - float(self.budget)))))  # type: ignore[arg-type]

    @property
    def compression_ratio(self) -> float:
        """``1 - budget`` for a kept fraction (kvpress's convention: the fraction removed).

        Raises:
            TokenBudgetError: for a token budget, which removes a different fraction of every prompt length; use
                :meth:`compression_ratio_for` with the prompt length.
        """
        if self.tokens is not None:
            raise TokenBudgetError(
                f"a budget of tokens={self.tokens} per layer has no compression_ratio without the prompt length: "
                "use compression_ratio_for(prompt_tokens)"
            )
        return 1.0 - float(self.budget)  # type: ignore[arg-type]

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        """The fraction of a ``prompt_tokens``-token prompt removed: ``1 - average(prompt_tokens) / prompt_tokens``.

        Defined for both kinds; it is :func:`kept_ratio` of the kept count, so a kvpress press given this ratio
        keeps exactly :meth:`average` tokens. For a fraction it can differ from :attr:`compression_ratio` by the
        rounding of the kept count (10% of 100 tokens keeps 9: 0.91, not 0.9).

        Raises:
            ValueError: if ``prompt_tokens`` is not an integer ``>= 1``.
        """
        return kept_ratio(self.average(prompt_tokens), int(prompt_tokens))

    @property
    def value(self) -> float | int:
        """The budget as one number, as results rows store it: the fraction (a float), or the token count (an int).

        Rows written before token budgets had their own argument hold the same numbers, so a value ``<= 1`` is a
        fraction and a value ``> 1`` a token count (:meth:`from_value`).

        Raises:
            ValueError: for ``tokens=1``, whose number would read back as the fraction 1.0 (keep everything).
        """
        if self.tokens is None:
            return float(self.budget)  # type: ignore[arg-type]
        if self.tokens < self.ROW_TOKENS_MIN:
            raise ValueError(
                f"tokens={self.tokens} has no numeric budget value: {self.tokens} reads back as the kept fraction "
                f"{float(self.tokens)} (the full cache); use tokens >= {self.ROW_TOKENS_MIN}"
            )
        return int(self.tokens)

    @classmethod
    def from_value(cls, value: object) -> BudgetSpec:
        """The budget of a number as results rows store it (:attr:`value`): ``<= 1`` a fraction, ``> 1`` tokens.

        Args:
            value: a kept fraction in ``(0, 1]``, or an integer-valued token count ``>= 2`` (``512`` or ``512.0``).

        Raises:
            ValueError: for anything else (a value above 1 that is not a whole number, ``<= 0``, NaN, a bool).
        """
        if not is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
            raise ValueError(f"a budget value is a kept fraction in (0, 1] or a whole token count >= 2, got {value!r}")
        number = float(value)  # type: ignore[arg-type]
        if number <= 1:
            return cls(budget=number)
        if not number.is_integer():
            raise ValueError(f"budget value {value!r} is above 1, so a token count, but not a whole number")
        return cls(tokens=int(number))

    def kwargs(self) -> dict[str, float | int]:
        """``{"budget": fraction}`` or ``{"tokens": count}``, for ``make_press`` and the schedules."""
        return {"budget": float(self.budget)} if self.tokens is None else {"tokens": int(self.tokens)}  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        """``10%`` for a fraction, ``512 tokens per layer`` for a token count."""
        if self.tokens is not None:
            return f"{self.tokens} token{'s' if self.tokens != 1 else ''} per layer"
        return f"{100 * float(self.budget):g}%"  # type: ignore[arg-type]


def budget_value(value: object) -> float | int:
    """A results row's ``budget`` number normalised: a fraction as a float, a token count as an int.

    Args:
        value: a kept fraction in ``(0, 1]`` or an integer-valued token count ``>= 2``.

    Raises:
        ValueError: as :meth:`BudgetSpec.from_value`.
    """
    return BudgetSpec.from_value(value).value


def resolve_average_budget(
    budget: float | None = None, prompt_tokens: int | None = None, *, tokens: int | None = None
) -> int:
    """The average number of kept KV entries per layer of a budget (:meth:`BudgetSpec.average`).

    Args:
        budget: a kept *fraction* of the prompt, ``0 < budget <= 1`` (``0.1`` is the 10% budget of the RippleKV
            paper, 2026); a value above 1 is an error (use ``tokens``).
        prompt_tokens: the number of prompt tokens whose KV entries are being compressed (``>= 1``; required).
        tokens: instead of ``budget``, an average number of tokens per layer (an integer ``>= 1``).

    Returns:
        For a fraction, ``max(1, int(prompt_tokens * (1 - (1 - budget))))``, kvpress's count; for a token count,
        ``min(tokens, prompt_tokens)``. Always in ``[1, prompt_tokens]``.

    Raises:
        ValueError: if ``prompt_tokens`` is not an integer ``>= 1``, or unless exactly one of ``budget`` and
            ``tokens`` is given and valid.
    """
    if not is_integer(prompt_tokens) or prompt_tokens < 1:  # type: ignore[operator]
        raise ValueError(f"prompt_tokens must be an integer >= 1, got {prompt_tokens!r}")
    return check_budget(budget, tokens).average(int(prompt_tokens))  # type: ignore[arg-type]


def allocate_budgets(
    scores: Sequence[float],
    budget: float | None = None,
    prompt_tokens: int | None = None,
    config: AllocationConfig = DEFAULT_CONFIG,
    min_tokens: int = 1,
    *,
    tokens: int | None = None,
) -> list[int]:
    """Integer per-layer KV-cache budgets by the RippleKV rule (paper, 2026).

    The global budget is ``B = L * average`` for ``L = len(scores)`` and ``average`` the budget's
    :meth:`BudgetSpec.average` (a kept fraction ``budget`` or a token count ``tokens``, exactly one of them).
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
        budget: a kept fraction of the prompt in ``(0, 1]`` (see :func:`resolve_average_budget`); or None with
            ``tokens``.
        prompt_tokens: the number of prompt tokens (``>= 1``; required); also the per-layer cap.
        config: the disparity ``ratio`` and the clip bound ``gamma``.
        min_tokens: the requested minimum number of kept tokens per layer (``>= 0``), see ``floor`` above.
        tokens: instead of ``budget``, the average number of kept tokens per layer (an integer ``>= 1``).

    Returns:
        ``L`` integer budgets, one per layer.

    Raises:
        ValueError: on invalid scores, budget, prompt_tokens or min_tokens.
    """
    return list(allocate(scores, budget, prompt_tokens, config, min_tokens, tokens=tokens).budgets)


@dataclass(frozen=True)
class Allocation:
    """A RippleKV allocation (paper, 2026) with its intermediate quantities, as reported by the CLI.

    Attributes:
        scores: the per-layer sensitivity scores, as given.
        normalized: the min-max normalised scores in ``[0, 1]``.
        weights: the clipped multipliers ``clip(ratio ** normalized, 1 / gamma, gamma)``.
        budgets: the integer per-layer budgets (number of kept KV entries per layer).
        prompt_tokens: the prompt length the budgets were computed for (also the per-layer cap).
        average_budget: the average budget per layer, from :func:`resolve_average_budget`.
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
    """Like :func:`allocate_budgets`, but return the full :class:`Allocation` (RippleKV paper, 2026).

    Args:
        scores: one finite sensitivity score per layer (higher = more sensitive).
        budget: a kept fraction of the prompt in ``(0, 1]``; or None with ``tokens``.
        prompt_tokens: the number of prompt tokens (``>= 1``; required); also the per-layer cap.
        config: the disparity ``ratio`` and the clip bound ``gamma``.
        min_tokens: the requested minimum number of kept tokens per layer (``>= 0``).
        tokens: instead of ``budget``, the average number of kept tokens per layer (an integer ``>= 1``).

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
    average = resolve_average_budget(budget, prompt_tokens, tokens=tokens)
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
