"""Per-layer KV-cache budget schedules: how many tokens each layer keeps, over one token scorer.

SnapKV, PyramidKV and RippleKV select tokens the same way (SnapKV's observation-window attention); they differ
only in how many tokens each layer keeps. Each method is therefore a *schedule*, and one press
(:class:`ripplekv.presses.LayerBudgetPress`) applies any schedule with any kvpress scorer:

* :class:`UniformSchedule`: every layer keeps the same number of tokens (SnapKV, Li et al., 2024);
* :class:`PyramidSchedule`: linearly fewer tokens with depth (PyramidKV, Cai et al., 2024, as its authors'
  code computes it), rescaled to SnapKV's total;
* :class:`ProfileSchedule`: budgets from measured per-layer sensitivities (the RippleKV rule, 2026).

Every schedule spends exactly the same global budget ``L * average`` (SnapKV's number of kept tokens), so methods
are always compared at the same number of kept tokens. The budget is given as ``budget=`` (a kept fraction in
``(0, 1]``; the first field, so ``UniformSchedule(0.1)`` is 10%) or as ``tokens=`` (an average token count per
layer, keyword only), exactly one of the two (:class:`~ripplekv.allocation.budget.BudgetSpec`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
from typing import ClassVar

from ripplekv.allocation.budget import BudgetSpec, scale_to_total
from ripplekv.allocation.ripplekv_rule import DEFAULT_GAMMA, DEFAULT_RATIO, AllocationConfig, allocate, validate_scores
from ripplekv.validation import is_integer

__all__ = [
    "BudgetSchedule",
    "ProfileSchedule",
    "PyramidSchedule",
    "UniformSchedule",
]


def _check_call(n_layers: int, floor: int) -> None:
    if not is_integer(n_layers) or n_layers < 1:
        raise ValueError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    if not is_integer(floor) or floor < 0:
        raise ValueError(f"floor must be an integer >= 0, got {floor!r}")


class BudgetSchedule(ABC):
    """A per-layer budget schedule: frozen, validated at construction, with ``budget`` and ``tokens`` attributes.

    Exactly one of ``budget`` (a kept fraction in ``(0, 1]``) and ``tokens`` (an average token count per layer,
    an integer ``>= 1``) is set; the other is None. The schedule spends ``n_layers * average(prompt_tokens)``
    tokens in all.

    ``compression_ratio`` is kvpress's ``1 - budget`` for a fraction; for a token budget it raises
    :class:`~ripplekv.allocation.budget.TokenBudgetError`, there being no ratio without the prompt length;
    ``compression_ratio_for(prompt_tokens)`` is defined for both (see :class:`BudgetSpec`).
    """

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

    @property
    def spec(self) -> BudgetSpec:
        """The budget as a :class:`~ripplekv.allocation.budget.BudgetSpec`."""
        return BudgetSpec(self.budget, self.tokens)

    def average(self, prompt_tokens: int) -> int:
        """Kept tokens per layer on average for a prompt of ``prompt_tokens`` tokens (see :class:`BudgetSpec`)."""
        return self.spec.average(prompt_tokens)

    @property
    def compression_ratio(self) -> float:
        """``1 - budget`` for a kept fraction.

        Raises:
            TokenBudgetError: for a token budget (use :meth:`compression_ratio_for`).
        """
        return self.spec.compression_ratio

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        """The fraction of a ``prompt_tokens``-token prompt removed on average over the layers, for both kinds.

        ``1 - average(prompt_tokens) / prompt_tokens`` (see :meth:`BudgetSpec.compression_ratio_for`).
        """
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


@dataclass(frozen=True)
class ProfileSchedule(BudgetSchedule):
    """RippleKV's schedule (2026): budgets from measured per-layer sensitivity scores.

    The RippleKV rule of :func:`ripplekv.allocation.allocate`: min-max normalise the scores, weight
    ``w_l = ratio ** s_l``, clip to ``[1 / gamma, gamma]``, rescale to the global budget (water-filling,
    largest remainder).

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
