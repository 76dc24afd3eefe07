"""LAVa's per-layer budgets: the normalised entropy of value-weighted window attention.

Shen et al., 2025, arXiv:2509.09754 (github.com/MGDDestiny/Lava @ ``71d3cc8``, ``LavaKVCluster.calcul_attn_score``).
With window attention ``A`` over the ``n - w`` prefix keys and values ``V`` (``g`` the KV head of query head ``h``):
``S[b, h, j] = pool_j(mean_i A[b, h, i, j]) * max_j' ||V[b, g, j', :]||_1`` (reduced to KV heads by a max with
``gqa_support``); ``p = S / (sum S + 1e-16)`` over all the layer's ``N`` entries; ``e_l = -sum p log(p + 1e-16) /
log N`` (0 when ``N == 1``); each layer keeps its window plus ``e_l / sum(e) * L * (C - w)``. The head-wise split
is :mod:`ripplekv.allocation.lava_heads`. Defaults: ``kernel_size = 7``, ``maxpool``, ``gqa_support``. Deviations
(one pass after the prefill, exact total, float64, the scorer's window): docs/allocators.md, "LAVa".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from ripplekv.allocation.per_prompt import (
    PerPromptRule,
    apportion,
    check_pooling,
    check_rule_call,
    even_split,
    finite_array,
    layer_floor,
    pool_keys,
)

if TYPE_CHECKING:
    import torch

LAVA_EPS: float = 1e-16
"""The constant LAVa adds to the normaliser and inside the log (``calcul_attn_score``)."""


class LavaStatistic(NamedTuple):
    """One layer's LAVa statistic: ``e_l``, the normalised entropy (in ``[0, 1]``) of its scores ``S``."""

    entropy: float


def lava_token_scores(
    window_attention: torch.Tensor,
    values: torch.Tensor,
    kernel_size: int = 7,
    pooling: str = "maxpool",
    gqa_support: bool = True,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """LAVa's score ``S`` of every prefix token (``calcul_attn_score`` before the entropy), non-negative.

    ``window_attention`` is softmaxed ``(batch, heads, w, n - w)`` (kvpress's ``compute_window_attention``);
    ``values`` ``(batch, kv_heads, n, head_dim)``, the first ``n - w`` read; query head ``h`` reads KV head
    ``h // groups``. Returns ``(batch, kv_heads, n - w)`` with ``gqa_support``, else ``(batch, heads, n - w)``, in
    ``dtype`` (default float64). ValueError on bad shapes, pooling or values.
    """
    import torch

    check_pooling("lava_token_scores", kernel_size, pooling)
    if window_attention.dim() != 4 or values.dim() != 4:
        raise ValueError(
            "window_attention must be (batch, heads, window, prefix_keys) and values (batch, kv_heads, tokens, "
            f"head_dim), got shapes {tuple(window_attention.shape)} and {tuple(values.shape)}"
        )
    batch, heads, _, prefix = window_attention.shape
    kv_heads = values.shape[1]
    if prefix < 1 or values.shape[0] != batch or values.shape[2] < prefix or kv_heads < 1 or heads % kv_heads:
        raise ValueError(
            f"window_attention {tuple(window_attention.shape)} and values {tuple(values.shape)} do not match: "
            "need the same batch, at least prefix_keys >= 1 value tokens and heads a multiple of kv_heads"
        )
    dtype = torch.float64 if dtype is None else dtype
    attention = window_attention.detach().to(dtype)
    value = values.detach().to(dtype)[:, :, :prefix, :]
    if not bool(torch.isfinite(attention).all()) or bool((attention < 0).any()) or not bool(value.isfinite().all()):
        raise ValueError("window_attention must be finite and non-negative, and values finite")
    pooled = pool_keys(attention.mean(dim=2), kernel_size, pooling)
    groups = heads // kv_heads
    norms = value.abs().sum(dim=-1).amax(dim=-1)  # (batch, kv_heads): max over prefix tokens of the L1 norm
    scores = pooled * norms.repeat_interleave(groups, dim=1).unsqueeze(-1)  # query head h reads KV head h // groups
    if gqa_support:
        scores = scores.reshape(batch, kv_heads, groups, prefix).amax(dim=2)
    return scores


def lava_layer_statistic(
    window_attention: torch.Tensor,
    values: torch.Tensor,
    kernel_size: int = 7,
    pooling: str = "maxpool",
    gqa_support: bool = True,
) -> LavaStatistic:
    """LAVa's ``LavaStatistic(E / log N)`` of one layer in float64, over all entries of :func:`lava_token_scores`."""
    import torch

    scores = lava_token_scores(window_attention, values, kernel_size, pooling, gqa_support)
    flat = scores.reshape(-1)
    if flat.numel() == 1:
        return LavaStatistic(0.0)
    probs = flat / (flat.sum() + LAVA_EPS)
    entropy = -(probs * torch.log(probs + LAVA_EPS)).sum()
    return LavaStatistic(float(entropy) / math.log(flat.numel()))


@dataclass(frozen=True)
class LavaRule(PerPromptRule):
    """LAVa's layer allocation (Shen et al., 2025): budgets beyond the window proportional to the entropy ``e_l``
    (``kernel_size``: odd pooling width; ``gqa_support``: scores reduced to KV heads by a max over query heads)."""

    kernel_size: int = 7
    pooling: str = "maxpool"
    gqa_support: bool = True
    name: ClassVar[str] = "lava"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("window_attention", "values")
    statistic_names: ClassVar[tuple[str, ...]] = LavaStatistic._fields

    def __post_init__(self) -> None:
        check_pooling("LavaRule", self.kernel_size, self.pooling)
        if not isinstance(self.gqa_support, bool):
            raise ValueError(f"LavaRule.gqa_support must be a bool, got {self.gqa_support!r}")

    def layer_statistic(  # type: ignore[override]
        self, window_attention: torch.Tensor, values: torch.Tensor
    ) -> LavaStatistic:
        return lava_layer_statistic(window_attention, values, self.kernel_size, self.pooling, self.gqa_support)

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
        """The window plus a share of ``total - L * w`` proportional to ``e``; non-decreasing in ``e``."""
        check_rule_call(n_layers, prompt_tokens, floor, stats=stats, total=total, window_size=window_size)
        if any(len(tuple(s)) != 1 for s in stats):
            raise ValueError("every LAVa statistic must be a 1-tuple (entropy,)")
        entropy = finite_array([tuple(s)[0] for s in stats], "LAVa entropies e_l")
        spare = total - n_layers * window_size
        if spare <= 0 or window_size >= prompt_tokens or not entropy.any():
            return even_split(total, n_layers)
        low = layer_floor(n_layers, prompt_tokens, floor, total=total, window_size=window_size)
        weights = [Fraction(float(e)) for e in entropy]
        return apportion([window_size] * n_layers, weights, total, [low] * n_layers, [prompt_tokens] * n_layers)
