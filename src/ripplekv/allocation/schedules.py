"""The schedules of the methods RippleKV is compared with: SnapKV's (uniform) and PyramidKV's (RippleKV's own is
:class:`~ripplekv.allocation.budget.ProfileSchedule`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import ClassVar

from ripplekv.allocation.budget import BudgetSchedule, scale_to_total
from ripplekv.validation import is_integer

__all__ = ["PyramidSchedule", "UniformSchedule"]


@dataclass(frozen=True)
class UniformSchedule(BudgetSchedule):
    """SnapKV's schedule (Li et al., 2024, arXiv:2404.14469): every layer keeps ``average(prompt_tokens)``."""

    budget: float | None = None
    tokens: int | None = field(default=None, kw_only=True)
    uniform: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self._check_budget()

    def layer_budgets(self, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
        self._check_call(n_layers, floor)
        return (self.spec.average(prompt_tokens),) * n_layers


@dataclass(frozen=True)
class PyramidSchedule(BudgetSchedule):
    """PyramidKV's schedule (Cai et al., 2024, arXiv:2406.02069): linearly fewer tokens with depth, as the
    authors' code computes it (github.com/Zefan-Cai/PyramidKV, ``PyramidKVCluster.update_kv``), for ``L``
    layers, ``n`` prompt tokens, a window of ``W`` and the uniform per-layer budget ``C > W``::

        min_num = (C - W) // beta
        max_num = 2 (C - W) - min_num
        if max_num >= n - W:  max_num = n - W;  min_num = 2 (C - W) - max_num
        steps   = (max_num - min_num) // (L - 1)
        layer l keeps (max_num - l * steps) selected tokens + the W window tokens

    The integer ``steps`` miss ``L * C`` by a few percent, so these capacities are weights rescaled
    (:func:`~ripplekv.allocation.budget.scale_to_total`) to exactly ``L * C``, each layer in ``[max(W, floor), n]``.
    No fallback to uniform (kvpress 0.5.5's ``PyramidKVPress`` falls back unless ``C - W >= beta * W``); when
    ``C <= W`` every layer keeps ``C``, as SnapKV.

    Attributes:
        window_size: SnapKV's observation window ``W``, kept by every layer.
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
        self._check_call(n_layers, 0)
        per_layer = self.spec.average(prompt_tokens)
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
        self._check_call(n_layers, floor)
        return _pyramid_budgets(self, n_layers, prompt_tokens, floor)


@lru_cache(maxsize=256)
def _pyramid_budgets(schedule: PyramidSchedule, n_layers: int, prompt_tokens: int, floor: int) -> tuple[int, ...]:
    window = int(schedule.window_size)
    capacities = schedule.capacities(n_layers, prompt_tokens)
    total = n_layers * schedule.spec.average(prompt_tokens)
    if len(set(capacities)) == 1:  # a flat pyramid (e.g. C <= W): every layer keeps C
        return (total // n_layers,) * n_layers
    weights = [Fraction(c) for c in capacities]
    return tuple(scale_to_total(weights, total, max(floor, window), prompt_tokens))
