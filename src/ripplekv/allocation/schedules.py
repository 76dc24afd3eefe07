"""Per-layer KV-cache budget schedules over one token scorer: SnapKV, PyramidKV and RippleKV differ only here.

One press, :class:`ripplekv.presses.LayerBudgetPress`, applies any schedule with any kvpress scorer. Every schedule
spends exactly SnapKV's global budget ``L * average`` (``budget=`` or keyword-only ``tokens=``, as
:class:`~ripplekv.allocation.budget.BudgetSpec`), so methods are compared at the same number of kept tokens.
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
    """A per-layer budget schedule: frozen, validated at construction, ``budget`` or ``tokens`` set (exactly one)."""

    budget: float | None
    tokens: int | None
    uniform: ClassVar[bool] = False
    """True when every layer always keeps the same number of tokens (no variable-length attention needed)."""

    def _check_budget(self) -> None:
        """Validate and normalise ``budget`` / ``tokens`` (each subclass's ``__post_init__`` calls it)."""
        try:
            spec = BudgetSpec(self.budget, self.tokens)
        except ValueError as error:
            raise ValueError(f"{type(self).__name__}: {error}") from None
        object.__setattr__(self, "budget", spec.budget)
        object.__setattr__(self, "tokens", spec.tokens)

    @cached_property
    def spec(self) -> BudgetSpec:
        """The budget as a :class:`~ripplekv.allocation.budget.BudgetSpec`, built once."""
        return BudgetSpec(self.budget, self.tokens)

    def average(self, prompt_tokens: int) -> int:
        """Kept tokens per layer on average for a prompt of ``prompt_tokens`` tokens."""
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
        """Tokens kept by each layer: ``n_layers`` integers summing to ``n_layers * average(prompt_tokens)``.

        Each is in ``[min(floor, prompt_tokens, average), prompt_tokens]``; ``floor`` (e.g. the scorer's window) is
        lowered to the average when ``n_layers * floor`` exceeds the global budget.

        Raises:
            ValueError: on an invalid argument, or one the schedule cannot serve.
        """

    def check_layers(self, n_layers: int) -> None:
        """Raise ``ValueError`` if the schedule cannot serve a model of ``n_layers`` layers."""
        _check_call(n_layers, 0)

    def over_layers(self, layers: Sequence[int], n_layers: int) -> BudgetSchedule:
        """The schedule of the compressed ``layers`` (increasing indices) of a model of ``n_layers`` layers.

        A press that leaves some layers whole spreads ``len(layers) * average`` over the compressed layers alone:
        ``over_layers(...).layer_budgets(len(layers), ...)[k]`` is layer ``layers[k]``'s budget. Uniform and
        pyramid schedules are unchanged; a profile schedule keeps those layers' scores.

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
    """SnapKV's schedule (Li et al., 2024, arXiv:2404.14469): every layer keeps ``average(prompt_tokens)`` tokens.

    For a fraction that is kvpress's ``int(prompt_tokens * (1 - compression_ratio))``; for a token count
    ``min(tokens, prompt_tokens)``.
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

    As the authors' code computes it (github.com/Zefan-Cai/PyramidKV, ``PyramidKVCluster.update_kv``), for ``L``
    layers, ``n`` prompt tokens, a window of ``W`` and the uniform per-layer budget ``C > W``::

        min_num = (C - W) // beta
        max_num = 2 (C - W) - min_num
        if max_num >= n - W:  max_num = n - W;  min_num = 2 (C - W) - max_num
        steps   = (max_num - min_num) // (L - 1)
        layer l keeps (max_num - l * steps) selected tokens + the W window tokens

    The integer ``steps`` miss ``L * C`` by a few percent, so the capacities are weights rescaled
    (:func:`~ripplekv.allocation.budget.scale_to_total`) to exactly ``L * C``, each layer in ``[max(W, floor), n]``.
    No fallback to uniform (kvpress 0.5.5's ``PyramidKVPress`` falls back unless ``C - W >= beta * W``). When
    ``C <= W`` (10% of a 284-token prompt is 28 tokens, under a 64-token window) every layer keeps ``C``, as SnapKV.

    Attributes:
        window_size: SnapKV's observation window ``W``, always kept by every layer.
        beta: steepness (authors' default 20): the last layer selects about ``1 / beta`` of the average's tokens.
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
        """The authors' per-layer capacities (selected tokens + window) before rescaling; ``C`` each if ``C <= W``."""
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
        """The capacities rescaled to ``L * C``; non-increasing in depth."""
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
"""Default disparity ``r``: the most sensitive layer's multiplier over the least's. Chosen with
:data:`DEFAULT_GAMMA` on a needle-retrieval grid (docs/results.md, ``benchmarks/results/needle_sweep.txt``)."""

DEFAULT_GAMMA: float = 3.0
"""Default clip bound ``gamma``: multipliers are clipped to ``[1 / gamma, gamma]``."""


@dataclass(frozen=True)
class AllocationConfig:
    """Hyper-parameters of the RippleKV rule (paper, 2026).

    Attributes:
        ratio: base ``r`` of ``w_l = r ** s_l`` over the min-max normalised sensitivity ``s_l`` (finite, ``> 0``):
            ``r > 1`` favours sensitive layers, ``1`` is uniform, ``< 1`` inverts the order.
        gamma: clip bound (finite, ``>= 1``; ``1`` is uniform); bounds the ratio of any two unrounded,
            not bound-limited budgets by ``gamma ** 2``.
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
    """``scores`` (one sensitivity per layer) as a 1-D float64 array.

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
    """Min-max normalise sensitivity scores to ``[0, 1]`` (step 1 of the RippleKV rule); all zeros if all equal.

    Raises:
        ValueError: as :func:`validate_scores`.
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
    """RippleKV multipliers ``clip(ratio ** normalize_scores(scores), 1 / gamma, gamma)``, before rescaling.

    Equal scores get equal weights; for ``ratio >= 1`` the weights are non-decreasing in the scores.

    Raises:
        ValueError: as :func:`validate_scores`.
    """
    return _weights_from_normalized(normalize_scores(scores), config)


@dataclass(frozen=True)
class Allocation:
    """A RippleKV allocation with its intermediate quantities, as the CLI reports it.

    Attributes:
        normalized: the min-max normalised scores.
        weights: the clipped multipliers (:func:`layer_weights`).
        budgets: kept KV entries per layer.
        prompt_tokens: the prompt length the budgets are for (also the per-layer cap).
        total: ``len(budgets) * average_budget == sum(budgets)``.
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
    """Integer per-layer budgets by the RippleKV rule, with the quantities they came from.

    The global budget is ``B = L * average`` (``L = len(scores)``; ``budget`` or ``tokens`` as :class:`BudgetSpec`).
    Layer ``l`` gets the real share ``clip(t * w_l, floor, prompt_tokens)``, ``w`` from :func:`layer_weights` and
    ``t`` such that the shares sum to ``B`` (water-filling), rounded by largest remainder (ties: larger weight, then
    higher score -- lower when ``ratio < 1`` --, then lower layer index). So the budgets

    * sum exactly to ``B``;
    * lie in ``[floor, prompt_tokens]``, ``floor = min(min_tokens, prompt_tokens)`` lowered to ``B // L`` (``>= 1``)
      when ``L * floor > B``;
    * are non-decreasing in the scores for ``ratio >= 1`` (non-increasing below), even where clipping ties
      weights; equal scores give budgets within one of each other;
    * all equal the average for equal scores, ``ratio == 1`` or ``gamma == 1``.

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
    """RippleKV's schedule (paper, 2026): :func:`allocate` over measured per-layer sensitivity ``scores``.

    ``scores`` are one per model layer or, where the press leaves layers whole, one per compressed layer
    (:meth:`over_layers`); ``ratio`` and ``gamma`` are :class:`AllocationConfig`'s.
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
