"""Per-layer KV-cache budget schedules: how many tokens each layer keeps, over one token scorer.

SnapKV, PyramidKV and RippleKV select tokens the same way (SnapKV's observation-window attention); they differ
only in how many tokens each layer keeps. Each method is therefore a *schedule*, and one press
(:class:`ripplekv.presses.LayerBudgetPress`) applies any schedule with any kvpress scorer:

* :class:`UniformSchedule`: every layer keeps the same number of tokens (SnapKV, Li et al., 2024);
* :class:`PyramidSchedule`: linearly fewer tokens with depth (PyramidKV, Cai et al., 2024, as its authors'
  code computes it), rescaled to SnapKV's total;
* :class:`ProfileSchedule`: budgets from measured per-layer sensitivities by the RippleKV rule (paper, 2026):

  1. min-max normalise the scores ``s`` to ``[0, 1]`` (all-equal scores normalise to 0, i.e. uniform);
  2. map each normalised score to a multiplier ``w_l = ratio ** s_l`` (``ratio``, the paper's ``r``, sets the
     disparity between the least and the most sensitive layer; ``ratio == 1`` is uniform);
  3. clip the multipliers to ``[1 / gamma, gamma]`` (``gamma >= 1``; ``gamma == 1`` is uniform);
  4. rescale so that the integer per-layer budgets sum to the global budget (:func:`allocate`).

Every schedule spends exactly SnapKV's global budget ``L * average``, so methods are compared at the same number
of kept tokens. Its budget is ``budget=`` (the first field: ``UniformSchedule(0.1)`` is 10%) or ``tokens=`` (keyword
only), as :class:`~ripplekv.allocation.budget.BudgetSpec` defines them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Any, ClassVar

import numpy as np

from ripplekv.allocation.budget import BudgetSpec, scale_to_total
from ripplekv.validation import is_integer, is_real

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GAMMA",
    "DEFAULT_RATIO",
    "Allocation",
    "AllocationConfig",
    "BudgetSchedule",
    "ProfileSchedule",
    "PyramidSchedule",
    "UniformSchedule",
    "allocate",
    "layer_weights",
    "normalize_scores",
    "validate_scores",
]


def _check_call(n_layers: int, floor: int) -> None:
    if not is_integer(n_layers) or n_layers < 1:
        raise ValueError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    if not is_integer(floor) or floor < 0:
        raise ValueError(f"floor must be an integer >= 0, got {floor!r}")


class BudgetSchedule(ABC):
    """A per-layer budget schedule: frozen, validated at construction, with ``budget`` and ``tokens`` attributes
    (exactly one set, :class:`BudgetSpec`); it spends ``n_layers * average(prompt_tokens)`` tokens in all."""

    budget: float | None
    tokens: int | None
    uniform: ClassVar[bool] = False
    """True when every layer always keeps the same number of tokens (no variable-length attention needed)."""

    def _check_budget(self) -> None:
        """Validate and normalise ``budget`` / ``tokens`` (called by each subclass's ``__post_init__``)."""
        try:
            spec = BudgetSpec(self.budget, self.tokens)
        except ValueError as error:
            raise ValueError(f"{type(self).__name__}: {error}") from None
        object.__setattr__(self, "budget", spec.budget)
        object.__setattr__(self, "tokens", spec.tokens)

    @cached_property
    def spec(self) -> BudgetSpec:
        """The budget as a :class:`~ripplekv.allocation.budget.BudgetSpec` (built once per schedule)."""
        return BudgetSpec(self.budget, self.tokens)

    def average(self, prompt_tokens: int) -> int:
        """Kept tokens per layer on average for a prompt of ``prompt_tokens`` tokens (see :class:`BudgetSpec`)."""
        return self.spec.average(prompt_tokens)

    @property
    def compression_ratio(self) -> float:
        """:attr:`BudgetSpec.compression_ratio` (a token budget raises ``TokenBudgetError``)."""
        return self.spec.compression_ratio

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        """:meth:`BudgetSpec.compression_ratio_for`: the average fraction of the prompt removed, for both kinds."""
        return self.spec.compression_ratio_for(prompt_tokens)

    @abstractmethod
    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        """Tokens kept by each layer.

        Args:
            n_layers: number of layers of the model (``>= 1``).
            prompt_tokens: number of prompt tokens being compressed (``>= 1``); also the per-layer cap.
            floor: smallest number of tokens a layer should keep (``>= 0``), e.g. the scorer's window;
                lowered to the average when ``n_layers * floor`` exceeds the global budget.

        Returns:
            ``n_layers`` integers summing exactly to ``n_layers * average(prompt_tokens)``, each in
            ``[min(floor, prompt_tokens, average), prompt_tokens]``.

        Raises:
            ValueError: on an invalid argument, or one the schedule cannot serve.
        """

    def check_layers(self, n_layers: int) -> None:
        """Raise ``ValueError`` if the schedule cannot serve a model of ``n_layers`` layers."""
        _check_call(n_layers, 0)

    def over_layers(self, layers: Sequence[int], n_layers: int) -> BudgetSchedule:
        """The schedule of the compressed ``layers`` of a model of ``n_layers`` layers (its global layers).

        A press that leaves some layers whole (sliding-window layers) spreads the budget of the compressed layers,
        ``len(layers) * average``, over them alone: ``over_layers(...).layer_budgets(len(layers), ...)[k]`` is the
        budget of layer ``layers[k]``. Uniform and pyramid budgets depend on the number of layers only (the
        schedule itself); a profile schedule keeps the scores of those layers.

        Args:
            layers: indices of the compressed layers, increasing, within ``range(n_layers)``.
            n_layers: layers of the model.

        Raises:
            ValueError: if the schedule cannot serve the model, or ``layers`` is not a non-empty increasing
                subsequence of ``range(n_layers)``.
        """
        self.check_layers(n_layers)
        _check_subset(layers, n_layers)
        return self


def _check_subset(layers: Sequence[int], n_layers: int) -> None:
    if not layers or any(not is_integer(i) for i in layers) or list(layers) != sorted(set(layers)):
        raise ValueError(f"compressed layers must be increasing layer indices, got {list(layers)!r}")
    if layers[0] < 0 or layers[-1] >= n_layers:
        raise ValueError(f"compressed layers {list(layers)!r} are not layers of a model of {n_layers} layers")


@dataclass(frozen=True)
class UniformSchedule(BudgetSchedule):
    """SnapKV's schedule (Li et al., 2024, arXiv:2404.14469): every layer keeps the same number of tokens.

    Each layer keeps ``average(prompt_tokens)`` tokens: for a fraction kvpress's exact
    ``int(prompt_tokens * (1 - compression_ratio))`` with ``compression_ratio = 1 - budget``; for a token count
    ``min(tokens, prompt_tokens)``.

    Attributes:
        budget: kept fraction of the prompt in ``(0, 1]``, or None when ``tokens`` is given.
        tokens: average kept tokens per layer (an integer ``>= 1``; keyword only), or None.
    """

    budget: float | None = None
    tokens: int | None = field(default=None, kw_only=True)
    uniform: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self._check_budget()

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        """``n_layers`` copies of the average budget (``floor`` never binds: the average already meets it)."""
        _check_call(n_layers, floor)
        return (self.average(prompt_tokens),) * n_layers


@dataclass(frozen=True)
class PyramidSchedule(BudgetSchedule):
    """PyramidKV's schedule (Cai et al., 2024, arXiv:2406.02069): linearly fewer tokens with depth.

    As the authors' code computes it (github.com/Zefan-Cai/PyramidKV, ``pyramidkv/pyramidkv_utils.py``,
    ``PyramidKVCluster.update_kv``), for ``L`` layers, a prompt of ``n`` tokens, a window of ``W`` tokens and
    ``C`` the per-layer kept tokens of the uniform budget (window included, ``C > W``)::

        min_num = (C - W) // beta
        max_num = 2 (C - W) - min_num
        if max_num >= n - W:  max_num = n - W;  min_num = 2 (C - W) - max_num
        steps   = (max_num - min_num) // (L - 1)
        layer l keeps (max_num - l * steps) selected tokens + the W window tokens

    The integer ``steps`` make those capacities overshoot or undershoot ``L * C`` by a few percent, so they
    are used as weights and rescaled (:func:`ripplekv.allocation.budget.scale_to_total`) to SnapKV's total
    ``L * C`` exactly, every layer keeping at least ``W`` tokens (and ``floor``) and at most ``n``: methods
    are compared at the same number of kept tokens. There is no fallback to uniform budgets (kvpress 0.5.5's
    ``PyramidKVPress`` falls back to SnapKV unless ``C - W >= beta * W``, i.e. at every length used here).

    One degenerate case: when ``C <= W`` (a short prompt at a small budget: 10% of a 284-token prompt is 28
    tokens per layer, under a 64-token window) there are no tokens beyond the window for the pyramid to
    distribute (the authors' code asserts ``C > W``), and every layer keeps ``C`` tokens, as SnapKV does.

    Attributes:
        budget: kept fraction of the prompt in ``(0, 1]``, or None when ``tokens`` is given.
        window_size: SnapKV's observation window ``W`` (``>= 1``), always kept by every layer.
        beta: the pyramid's steepness (an integer ``>= 1``; the authors' default is 20): the last layer's
            selected tokens are about ``1 / beta`` of the average's.
        tokens: average kept tokens per layer (an integer ``>= 1``; keyword only), or None.
    """

    budget: float | None = None
    window_size: int = 64
    beta: int = 20
    tokens: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self._check_budget()
        if not is_integer(self.window_size) or self.window_size < 1:
            raise ValueError(f"PyramidSchedule.window_size must be an integer >= 1, got {self.window_size!r}")
        if not is_integer(self.beta) or self.beta < 1:
            raise ValueError(f"PyramidSchedule.beta must be an integer >= 1, got {self.beta!r}")

    def capacities(self, n_layers: int, prompt_tokens: int) -> tuple[int, ...]:
        """The authors' per-layer capacities (selected tokens + window), before rescaling to ``L * C``.

        When the uniform budget ``C`` is not larger than the window, ``C`` for every layer (see the class).
        """
        _check_call(n_layers, 0)
        per_layer = self.average(prompt_tokens)
        window = int(self.window_size)
        if per_layer <= window or n_layers == 1:
            return (per_layer,) * n_layers
        spare = per_layer - window
        min_num = spare // self.beta
        max_num = 2 * spare - min_num
        if max_num >= prompt_tokens - window:
            max_num = prompt_tokens - window
            min_num = 2 * spare - max_num
        steps = (max_num - min_num) // (n_layers - 1)
        return tuple(max_num - layer * steps + window for layer in range(n_layers))

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        """The capacities rescaled to ``L * C`` (see the class docstring); non-increasing in depth."""
        _check_call(n_layers, floor)
        return _pyramid_budgets(self, n_layers, prompt_tokens, floor)


@lru_cache(maxsize=256)
def _pyramid_budgets(schedule: PyramidSchedule, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
    window = int(schedule.window_size)
    capacities = schedule.capacities(n_layers, prompt_tokens)
    total = n_layers * schedule.average(prompt_tokens)
    if len(set(capacities)) == 1:  # a flat pyramid (e.g. C <= W: nothing beyond the window): every layer keeps C
        return (total // n_layers,) * n_layers
    weights = [Fraction(c) for c in capacities]
    return tuple(scale_to_total(weights, total, max(floor, window), prompt_tokens))


# ------------------------------------------------------------------------------------------- the RippleKV rule

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


@dataclass(frozen=True)
class ProfileSchedule(BudgetSchedule):
    """RippleKV's schedule (2026): budgets from measured per-layer sensitivity scores by the RippleKV rule
    (:func:`allocate`).

    On a model whose press leaves some layers whole (sliding-window layers, see :meth:`over_layers`) the scores
    are one per model layer, of which the compressed layers' are used, or one per compressed layer.

    Attributes:
        budget: kept fraction of the prompt in ``(0, 1]``, or None when ``tokens`` is given.
        scores: one finite sensitivity score per layer (stored as a tuple of floats; required, non-empty).
        ratio: disparity ``r`` of the multipliers (finite, ``> 0``; ``1`` gives uniform budgets).
        gamma: clip bound of the multipliers (finite, ``>= 1``).
        tokens: average kept tokens per layer (an integer ``>= 1``; keyword only), or None.
    """

    budget: float | None = None
    scores: tuple[float, ...] = ()
    ratio: float = DEFAULT_RATIO
    gamma: float = DEFAULT_GAMMA
    tokens: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self._check_budget()
        array = validate_scores(self.scores)
        object.__setattr__(self, "scores", tuple(float(s) for s in array))
        AllocationConfig(ratio=self.ratio, gamma=self.gamma)  # validates ratio and gamma

    def check_layers(self, n_layers: int) -> None:
        """Raise ``ValueError`` unless there is one score per layer."""
        _check_call(n_layers, 0)
        if len(self.scores) != n_layers:
            raise ValueError(f"{len(self.scores)} layer scores for a model of {n_layers} layers")

    def over_layers(self, layers: Sequence[int], n_layers: int) -> ProfileSchedule:
        """The schedule of the scores of ``layers`` alone (itself when the scores are one per compressed layer).

        Args:
            layers: indices of the compressed layers, increasing, within ``range(n_layers)``.
            n_layers: layers of the model.

        Raises:
            ValueError: unless there is one score per model layer or one per compressed layer.
        """
        _check_call(n_layers, 0)
        _check_subset(layers, n_layers)
        if len(self.scores) == len(layers):
            return self
        self.check_layers(n_layers)
        return replace(self, scores=tuple(self.scores[i] for i in layers))

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        """The RippleKV allocation of the scores (``floor`` is ``allocate``'s ``min_tokens``)."""
        _check_call(n_layers, floor)
        self.check_layers(n_layers)
        return _profile_budgets(self, prompt_tokens, floor)


@lru_cache(maxsize=256)
def _profile_budgets(schedule: ProfileSchedule, prompt_tokens: int, floor: int) -> tuple[int, ...]:
    config = AllocationConfig(ratio=schedule.ratio, gamma=schedule.gamma)
    return allocate(schedule.scores, schedule.budget, prompt_tokens, config, floor, tokens=schedule.tokens).budgets
