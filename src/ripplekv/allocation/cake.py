"""CAKE's per-layer budgets: preference from the window attention's dispersion and temporal shift.

Paper: Qin et al., "CAKE: Cascading and Adaptive KV Cache Eviction with Layer Preferences", ICLR 2025,
arXiv:2503.12491.

Source read: github.com/antgroup/cakekv at commit ``c4675ce21b1d6f62d262f9a8dc0ad1e1e8ee4edd``:
``cake/model/modify_llama.py`` (``llama_attn_forward_cake``: the statistic), ``cake/utils.py``
(``calculate_entropy``, ``adjust_budgets``), ``cake/cake_cache.py`` (``CakeprefillKVCache.__call__``: the
budgets), ``experiments/LongBench/pred_cake.py`` and ``experiments/LongBench/config/model2tau.json`` (defaults).

Formula. For layer ``l`` let ``A`` be the softmaxed attention of the last ``w`` queries (all query heads) over
all keys, causal within the window, sliced to the ``n - w`` prefix keys: ``A[b, h, i, j]``. Then

* dispersion ``H_l = -sum_{b,h,i,j} A log(A + 1e-10)`` (``calculate_entropy``: one sum over every axis);
* temporal shift ``V_l = sum_{b,h,j} Var_i A[b, h, i, j]`` (``torch.var`` over the window queries, unbiased,
  i.e. divided by ``w - 1``, then summed);
* preference ``P_l = H_l ** (1 / tau1) * V_l ** (1 / tau2)``;
* the ``L * (C - w)`` tokens beyond the windows (``C`` the per-layer cache size) are shared in proportion to
  ``P``: ``B_l = P_l / sum(P) * L * (C - w)``, capped at ``n - w``; the excess over the cap is spread evenly
  over the layers under it, and layer ``l`` keeps ``B_l`` selected tokens plus its window.

Defaults. ``tau1 = tau2 = 1``: ``pred_cake.py``'s ``--tau1/--tau2`` defaults, which are also its fallback for
a model missing from ``model2tau.json``. That file tunes (tau1, tau2) per model and cache size for five 7-13B
models (Llama-2/3.1, Mistral, Qwen2.5) only; none is a 30-layer SmolLM2-135M and the tuned values disagree in
direction across models (tau1 from 0.4 to 1.9), so none transfers, and SmolLM2-135M uses the untuned 1, 1.
(``pred_cake.py``'s ``gamma = 200`` weights the variance in CAKE's *token* eviction score, not in the
allocation; token selection here is the scorer's, so it is not a parameter of this rule.)

Deviations from the authors' code:

* Shared window: the statistic is computed over the token scorer's observation window (SnapKV's 64 by
  default) rather than CAKE's own 32, so that the window the budgets reserve is the one the scorer keeps.
* Exact total and bounds: ``adjust_budgets`` truncates ``B_l`` to integers, caps at ``n - w``, adds the excess
  evenly to the uncapped layers in one pass (which can push a layer past the cap again) and patches the total
  by adding or removing an even share (remainder to the first layers). Here the real shares are
  ``x_l = clip(B_l + s, lo, n - w)`` with one exact level ``s`` (``s > 0`` spreads the cap's excess evenly,
  repeatedly until no layer exceeds it; ``s < 0`` takes an even share from the others when ``floor`` lifts
  a layer), rounded by largest remainder: budgets sum exactly to SnapKV's total, stay in
  ``[max(floor, w), n]`` and never decrease with ``P``.
* No length gate: CAKE leaves the cache whole when ``n <= C + w``; here a budget is always allocated
  (a budget of the whole prompt keeps everything anyway). When ``C <= w`` (nothing beyond the windows),
  every layer gets the average, as :class:`~ripplekv.allocation.PyramidSchedule` does.
* Degenerate preferences: all ``P_l == 0`` (e.g. a one-key prefix) gives uniform budgets.
* Precision: the statistic is computed in float64 from the attention as given (CAKE computes the entropy in
  float32 and the variance in the model's dtype); a batch is summed over, as in the authors' code, so all its
  prompts share one set of budgets.
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

__all__ = ["CAKE_ENTROPY_EPS", "CakeRule", "CakeStatistic", "cake_layer_statistic", "cake_preferences"]

CAKE_ENTROPY_EPS: float = 1e-10
"""The constant inside CAKE's ``log(A + eps)`` (``cake/utils.py``, ``calculate_entropy``)."""


class CakeStatistic(NamedTuple):
    """One layer's CAKE statistic.

    Attributes:
        dispersion: ``H_l``, the entropy of the window attention summed over batch, heads, queries and keys.
        shift: ``V_l``, the variance of the window attention over the window queries, summed.
    """

    dispersion: float
    shift: float


def cake_layer_statistic(window_attention: torch.Tensor) -> CakeStatistic:
    """CAKE's dispersion and temporal shift of one layer.

    Args:
        window_attention: the softmaxed attention of the last ``w`` queries over the prompt, sliced to the
            prefix keys, ``(batch, heads, w, n - w)``, one row per query head: what kvpress's
            ``SnapKVPress.compute_window_attention(module, hidden_states, keys, w, position_embeddings)``
            returns in a press's ``compress``. Rows are softmaxed over all ``n`` keys, so they sum to at most 1.
            Needs ``w >= 2`` (the variance is unbiased).

    Returns:
        ``CakeStatistic(H, V)``, computed in float64 (see the module docstring for the formulas).

    Raises:
        ValueError: if the tensor is not 4-D, has fewer than two window queries, no prefix key, or a
            non-finite or negative entry.
    """
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
    """CAKE's layer preferences ``P_l = H_l ** (1 / tau1) * V_l ** (1 / tau2)``.

    Args:
        stats: one ``(H, V)`` per layer (:class:`CakeStatistic` or any pair).
        tau1: the dispersion's temperature (``> 0``).
        tau2: the shift's temperature (``> 0``).

    Returns:
        One finite preference ``>= 0`` per layer.

    Raises:
        ValueError: on a malformed, negative or non-finite statistic, or a non-finite preference.
    """
    pairs = [tuple(s) for s in stats]
    if any(len(p) != 2 for p in pairs):
        raise ValueError("every CAKE statistic must be a pair (dispersion, shift)")
    dispersion = finite_array([p[0] for p in pairs], "CAKE dispersions H_l")
    shift = finite_array([p[1] for p in pairs], "CAKE temporal shifts V_l")
    preference = dispersion ** (1.0 / tau1) * shift ** (1.0 / tau2)
    return tuple(float(p) for p in finite_array(preference, "CAKE preferences P_l"))


@dataclass(frozen=True)
class CakeRule(PerPromptRule):
    """CAKE's allocation (Qin et al., ICLR 2025): budgets beyond the window proportional to ``H^(1/tau1) V^(1/tau2)``.

    See the module docstring for the formula, the source and every deviation.

    Attributes:
        tau1: temperature of the dispersion ``H`` (finite, ``> 0``; default 1, the authors' untuned value).
        tau2: temperature of the temporal shift ``V`` (finite, ``> 0``; default 1).
    """

    tau1: float = 1.0
    tau2: float = 1.0
    name: ClassVar[str] = "cake"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("window_attention",)
    statistic_names: ClassVar[tuple[str, ...]] = CakeStatistic._fields

    def __post_init__(self) -> None:
        check_positive("CakeRule", "tau1", self.tau1)
        check_positive("CakeRule", "tau2", self.tau2)

    def layer_statistic(self, window_attention: torch.Tensor) -> CakeStatistic:  # type: ignore[override]
        """:func:`cake_layer_statistic` of ``window_attention`` ``(batch, heads, w, n - w)``."""
        return cake_layer_statistic(window_attention)

    def layer_budgets(
        self,
        stats: Sequence[Sequence[float]],
        n_layers: int,
        prompt_tokens: int,
        total: int,
        window: int,
        floor: int,
    ) -> tuple[int, ...]:
        """CAKE's budgets: the window plus a share of ``total - L * w`` proportional to ``P`` (see the module).

        Args:
            stats: one ``(H, V)`` per layer.
            n_layers: number of layers.
            prompt_tokens: prompt length; also the per-layer cap.
            total: global number of kept tokens.
            window: the scorer's observation window ``w``, kept by every layer.
            floor: smallest budget per layer.

        Returns:
            ``n_layers`` integers summing to ``total``, in ``[layer_floor(...), prompt_tokens]``, non-decreasing
            in ``P``.

        Raises:
            ValueError: on invalid arguments or statistics.
        """
        check_rule_call(stats, n_layers, prompt_tokens, total, window, floor)
        preference = cake_preferences(stats, self.tau1, self.tau2)
        low = layer_floor(n_layers, prompt_tokens, total, window, floor)
        spare = total - n_layers * window
        if spare <= 0 or window >= prompt_tokens or sum(preference) == 0:
            return even_split(total, n_layers)
        exact = [Fraction(p) for p in preference]
        mass = sum(exact)
        offsets = [window + p * spare / mass for p in exact]
        return apportion(offsets, [1] * n_layers, total, [low] * n_layers, [prompt_tokens] * n_layers, preference)
