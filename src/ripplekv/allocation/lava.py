"""LAVa's per-layer budgets: the normalised entropy of value-weighted window attention.

Paper: Shen et al., "LAVa: Layer-wise KV Cache Eviction with Dynamic Budget Allocation", 2025,
arXiv:2509.09754.

Source read: github.com/MGDDestiny/Lava at commit ``71d3cc89dfd10edf524e7eee2bb417b4a129f1b8``:
``adaptive_snapkv/monkeypatch/snapkv_utils.py`` (``LavaKVCluster.calcul_attn_score``: the statistic;
``update_kv_gqa`` / ``re_update_kv_gqa``: the head-wise split), ``adaptive_snapkv/monkeypatch/
adaptive_mistral_hijack_lava.py`` (the decoder loop: the layer budgets), ``experiments/LongBench/
eval_longbench_lava.sh``, ``experiments/LongBench/pred.py`` and ``experiments/LongBench/config/
c*_w32_k7_maxpool.json`` (the settings run).

Formula. For layer ``l`` with window attention ``A[b, h, i, j]`` (softmaxed over all keys, sliced to the
``n - w`` prefix keys) and values ``V[b, g, j, :]`` (``g`` the KV head of query head ``h``):

* ``S[b, h, j] = pool_j(mean_i A[b, h, i, j]) * max_j' ||V[b, g(h), j', :]||_1`` (max pool of width 7 along
  the keys, padded with ``-inf``; the value norm is the L1 norm, its max over the prefix keys);
* with ``gqa_support`` (the authors' LongBench script passes ``--gqa_support``), ``S`` is reduced to KV heads
  by a max over the query heads of each group;
* ``p = S / (sum S + 1e-16)`` over *all* entries of the layer (batch, heads and keys flattened together),
  entropy ``E = -sum p log(p + 1e-16)``, normalised ``e_l = E / log(N)`` with ``N`` the number of entries;
* each layer's budget beyond its window is ``e_l / sum(e) * L * (C - w)`` (``C`` the per-layer cache size).
  (LAVa then splits a layer's budget among its heads: :mod:`ripplekv.allocation.lava_heads`, run with this rule
  by :class:`ripplekv.presses.lava_press.LavaPress`; ``S`` itself is the token score of
  :class:`ripplekv.presses.lava_scorer.LavaScorerPress`.)

Defaults: ``kernel_size = 7``, ``pooling = "maxpool"``, ``gqa_support = True`` (``c*_w32_k7_maxpool.json``
and ``eval_longbench_lava.sh``). SmolLM2-135M uses grouped-query attention (9 query heads, 3 KV heads), like
the Mistral-7B the script runs, so the same ``gqa_support`` applies; nothing in the rule depends on depth.

Deviations from the authors' code:

* Shared window: the statistic is computed over the token scorer's observation window (SnapKV's 64 by
  default) instead of LAVa's 32, so that the window the budgets reserve is the one the scorer keeps.
* One pass after the prefill: the code recomputes every seen layer's share of the whole-model total after each
  layer and can only shrink a layer's cache (``re_update_kv_gqa`` returns early when the new capacity is
  larger). With non-negative ``e``, a layer's share ``e_l / sum_{j <= m} e_j`` only decreases as ``m``
  grows, so the last step's shares are the binding ones: computing them once after the last layer gives the
  same budgets.
* Exact total and bounds: the code truncates each share to an integer, and a layer whose share exceeds its
  prefix keeps the whole prompt with the excess lost. Here the shares ``w + t * e_l`` are solved by exact
  proportional water-filling within ``[max(floor, w), n]`` (a capped layer's excess goes to the others in
  proportion to ``e``), rounded by largest remainder (ties: the higher ``e``); budgets never decrease with
  ``e``. All ``e_l == 0`` gives uniform budgets.
* A single entry (``N == 1``) has no normalised entropy (``log 1 == 0``); it is defined as 0 here.
* Precision: the statistic is computed in float64 from the attention and values as given (the code uses
  the model's dtype).
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
)

if TYPE_CHECKING:
    import torch

__all__ = ["LAVA_EPS", "LavaRule", "LavaStatistic", "lava_layer_statistic", "lava_token_scores"]

LAVA_EPS: float = 1e-16
"""The constant LAVa adds to the normaliser and inside the log (``calcul_attn_score``)."""


class LavaStatistic(NamedTuple):
    """One layer's LAVa statistic.

    Attributes:
        entropy: ``e_l``, the normalised entropy (in ``[0, 1]``) of the layer's value-weighted pooled window
            attention.
    """

    entropy: float


def lava_token_scores(
    window_attention: torch.Tensor,
    values: torch.Tensor,
    kernel_size: int = 7,
    pooling: str = "maxpool",
    gqa_support: bool = True,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """LAVa's score of every prefix token: ``S`` of the module docstring (``calcul_attn_score`` before the entropy).

    Query head ``h`` reads the values of KV head ``h // groups`` (transformers' ``repeat_kv``), and with
    ``gqa_support`` the query heads ``g * groups ... (g + 1) * groups - 1`` are reduced to KV head ``g`` by a max.

    Args:
        window_attention: softmaxed window attention over the prefix keys, ``(batch, heads, w, n - w)``, one row
            per query head (kvpress's ``SnapKVPress.compute_window_attention``).
        values: the layer's value states ``(batch, kv_heads, n, head_dim)``; only the first ``n - w`` are read.
        kernel_size: pooling width along the keys (odd, ``>= 1``).
        pooling: ``"maxpool"`` (padded with ``-inf``) or ``"avgpool"`` (zero padding counted).
        gqa_support: reduce the scores to KV heads by a max over each group's query heads.
        dtype: the floating dtype computed in (default float64).

    Returns:
        ``(batch, kv_heads, n - w)`` with ``gqa_support``, else ``(batch, heads, n - w)``; non-negative.

    Raises:
        ValueError: on mismatched or malformed shapes, a bad pooling, or non-finite / negative attention.
    """
    import torch
    from torch.nn import functional as F

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
    mean = attention.mean(dim=2).reshape(batch * heads, 1, prefix)
    pad = kernel_size // 2
    if pooling == "maxpool":
        pooled = F.max_pool1d(mean, kernel_size=kernel_size, padding=pad, stride=1)
    else:
        pooled = F.avg_pool1d(mean, kernel_size=kernel_size, padding=pad, stride=1)
    pooled = pooled.reshape(batch, heads, prefix)
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
    """LAVa's normalised entropy of one layer: the entropy of :func:`lava_token_scores` over all its entries.

    Args:
        window_attention: softmaxed window attention over the prefix keys, ``(batch, heads, w, n - w)``, one row
            per query head (kvpress's ``SnapKVPress.compute_window_attention``).
        values: the layer's value states ``(batch, kv_heads, n, head_dim)``, the prompt's ``n`` tokens
            (``values`` in a press's ``compress``); only the first ``n - w`` (the prefix) are read.
        kernel_size: pooling width along the keys (odd, ``>= 1``).
        pooling: ``"maxpool"`` (padded with ``-inf``) or ``"avgpool"`` (zero padding counted).
        gqa_support: reduce the scores to KV heads by a max over each group's query heads.

    Returns:
        ``LavaStatistic(E / log N)`` in float64 (see the module docstring).

    Raises:
        ValueError: on mismatched or malformed shapes, a bad pooling, or non-finite / negative attention.
    """
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
    """LAVa's layer allocation (Shen et al., 2025): budgets beyond the window proportional to the entropy ``e_l``.

    See the module docstring for the formula, the source and every deviation.

    Attributes:
        kernel_size: pooling width along the keys (odd, ``>= 1``; default 7).
        pooling: ``"maxpool"`` (default) or ``"avgpool"``.
        gqa_support: reduce scores to KV heads by a max over each group (default ``True``).
    """

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
        """:func:`lava_layer_statistic` with this rule's pooling and ``gqa_support``."""
        return lava_layer_statistic(window_attention, values, self.kernel_size, self.pooling, self.gqa_support)

    def layer_budgets(
        self,
        stats: Sequence[Sequence[float]],
        n_layers: int,
        prompt_tokens: int,
        total: int,
        window: int,
        floor: int,
    ) -> tuple[int, ...]:
        """LAVa's budgets: the window plus a share of ``total - L * w`` proportional to ``e`` (see the module).

        Args:
            stats: one ``(entropy,)`` per layer.
            n_layers: number of layers.
            prompt_tokens: prompt length; also the per-layer cap.
            total: global number of kept tokens.
            window: the scorer's observation window ``w``, kept by every layer.
            floor: smallest budget per layer.

        Returns:
            ``n_layers`` integers summing to ``total``, in ``[layer_floor(...), prompt_tokens]``, non-decreasing
            in ``e``.

        Raises:
            ValueError: on invalid arguments or statistics.
        """
        check_rule_call(stats, n_layers, prompt_tokens, total, window, floor)
        if any(len(tuple(s)) != 1 for s in stats):
            raise ValueError("every LAVa statistic must be a 1-tuple (entropy,)")
        entropy = finite_array([tuple(s)[0] for s in stats], "LAVa entropies e_l")
        spare = total - n_layers * window
        if spare <= 0 or window >= prompt_tokens or not entropy.any():
            return even_split(total, n_layers)
        low = layer_floor(n_layers, prompt_tokens, total, window, floor)
        weights = [Fraction(float(e)) for e in entropy]
        return apportion([window] * n_layers, weights, total, [low] * n_layers, [prompt_tokens] * n_layers)
