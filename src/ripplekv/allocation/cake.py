"""CAKE's per-layer budgets: preference from the window attention's dispersion and temporal shift.

Qin et al., ICLR 2025, arXiv:2503.12491 (github.com/antgroup/cakekv @ ``c4675ce``, ``cake/utils.py``,
``cake/cake_cache.py``). With ``A`` the softmaxed window attention over the ``n - w`` prefix keys: dispersion
``H_l = -sum A log(A + 1e-10)`` over every axis, temporal shift ``V_l = sum_{b,h,j} Var_i A`` (unbiased), preference
``P_l = H_l ** (1 / tau1) * V_l ** (1 / tau2)``; each layer keeps its window plus ``P_l / sum(P) * L * (C - w)``,
capped at ``n - w`` with the excess spread evenly. Defaults ``tau1 = tau2 = 1``, ``pred_cake.py``'s untuned
fallback. Deviations (exact total and bounds, no length gate, float64, the scorer's window): docs/allocators.md, "CAKE".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from ripplekv.allocation.per_prompt import (
    PerPromptRule,
    apportion,
    check_positive,
    check_rule_call,
    even_split,
    finite_array,
    layer_floor,
)

if TYPE_CHECKING:
    import torch

CAKE_ENTROPY_EPS: float = 1e-10
"""The constant inside CAKE's ``log(A + eps)`` (``cake/utils.py``, ``calculate_entropy``)."""


class CakeStatistic(NamedTuple):
    """One layer's CAKE statistic: dispersion ``H_l`` and temporal shift ``V_l``."""

    dispersion: float
    shift: float


def cake_layer_statistic(window_attention: torch.Tensor) -> CakeStatistic:
    """CAKE's dispersion and temporal shift of one layer, in float64, from the softmaxed window attention over the
    prefix keys ``(batch, heads, w, n - w)`` (kvpress's ``compute_window_attention``; ``w >= 2``: the variance is
    unbiased)."""
    import torch

    if window_attention.dim() != 4:
        raise ValueError(
            f"window_attention must be (batch, heads, window, prefix_keys), got shape {tuple(window_attention.shape)}"
        )
    if window_attention.shape[2] < 2:
        raise ValueError(
            f"CAKE's temporal shift is an unbiased variance over the window queries: need a window of at least "
            f"2 queries, got {window_attention.shape[2]}"
        )
    if window_attention.shape[3] < 1:
        raise ValueError("window_attention has no prefix key (the prompt is not longer than the window)")
    attention = window_attention.detach().to(torch.float64)
    if not bool(torch.isfinite(attention).all()) or bool((attention < 0).any()):
        raise ValueError("window_attention must hold finite, non-negative attention weights")
    dispersion = -(attention * torch.log(attention + CAKE_ENTROPY_EPS)).sum()
    shift = attention.var(dim=2, correction=1).sum()
    return CakeStatistic(float(dispersion), float(shift))


def cake_preferences(stats: Sequence[Sequence[float]], tau1: float = 1.0, tau2: float = 1.0) -> tuple[float, ...]:
    """CAKE's layer preferences ``P_l = H_l ** (1 / tau1) * V_l ** (1 / tau2)``, one per ``(H, V)`` pair."""
    pairs = [tuple(s) for s in stats]
    if any(len(p) != 2 for p in pairs):
        raise ValueError("every CAKE statistic must be a pair (dispersion, shift)")
    dispersion = finite_array([p[0] for p in pairs], "CAKE dispersions H_l")
    shift = finite_array([p[1] for p in pairs], "CAKE temporal shifts V_l")
    preference = dispersion ** (1.0 / tau1) * shift ** (1.0 / tau2)
    return tuple(float(p) for p in finite_array(preference, "CAKE preferences P_l"))


@dataclass(frozen=True)
class CakeRule(PerPromptRule):
    """CAKE's allocation (Qin et al., ICLR 2025): budgets beyond the window proportional to ``H^(1/tau1) V^(1/tau2)``
    (temperatures ``tau1`` of the dispersion, ``tau2`` of the temporal shift, finite and ``> 0``)."""

    tau1: float = 1.0
    tau2: float = 1.0
    name: ClassVar[str] = "cake"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("window_attention",)
    statistic_names: ClassVar[tuple[str, ...]] = CakeStatistic._fields

    def __post_init__(self) -> None:
        check_positive("CakeRule", "tau1", self.tau1)
        check_positive("CakeRule", "tau2", self.tau2)

    def layer_statistic(self, window_attention: torch.Tensor) -> CakeStatistic:  # type: ignore[override]
        return cake_layer_statistic(window_attention)

    def layer_budgets(
        self,
        n_layers: int,
        prompt_tokens: int,
        floor: int,
        *,
        stats: Sequence[Sequence[float]],
        total: int,
        window_size: int,
    ) -> tuple[int, ...]:
        """The window plus a share of ``total - L * w`` proportional to ``P``; non-decreasing in ``P``."""
        check_rule_call(n_layers, prompt_tokens, floor, stats=stats, total=total, window_size=window_size)
        preference = cake_preferences(stats, self.tau1, self.tau2)
        low = layer_floor(n_layers, prompt_tokens, floor, total=total, window_size=window_size)
        spare = total - n_layers * window_size
        if spare <= 0 or window_size >= prompt_tokens or sum(preference) == 0:
            return even_split(total, n_layers)
        exact = [Fraction(p) for p in preference]
        mass = sum(exact)
        offsets = [window_size + p * spare / mass for p in exact]
        return apportion(offsets, [1] * n_layers, total, [low] * n_layers, [prompt_tokens] * n_layers, preference)
