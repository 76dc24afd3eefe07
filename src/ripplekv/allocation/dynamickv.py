"""DynamicKV's per-layer budgets: a global top-k of window-attention scores over the layers seen so far.

Zhou et al., EMNLP 2025, arXiv:2412.14838 (github.com/DreamMr/DynamicKV @ ``8ab3c08``, ``dynamic_v11.py``). With
``base = C - w`` selected tokens per layer on average and ``h`` query heads, layer ``l``'s statistic is its pooled
window attention; after every 4th layer the global top ``base * h * m`` entries of the ``m`` layers seen give each
a count ``c_l``, and it keeps ``base * L * c_l / sum(c)`` selected tokens, at most
``budget_size = min(int(radio_max * base), n - w)``. The code only truncates a cache further, so a layer keeps the
*minimum* of its shares over the updates (replayed here in one pass after the prefill). Defaults, the authors'
Llama script: ``kernel_size = 7``, ``pooling = "avgpool"``, ``radio_max = 10``, updates every 4 layers.
Deviations (a last update at the last layer, exact total, shared ties, the scorer's window):
docs/allocators.md, "DynamicKV".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import numpy as np

from ripplekv.allocation.per_prompt import (
    PerPromptRule,
    apportion,
    check_pooling,
    check_positive,
    check_rule_call,
    even_split,
    layer_floor,
    pool_keys,
    top_k_counts,
)
from ripplekv.validation import check_int

if TYPE_CHECKING:
    import torch


class DynamicKVStatistic(NamedTuple):
    """One layer's pooled window-attention scores over all heads and prefix keys, flattened in decreasing order
    (float64; possibly only the best ``keep``), and ``heads``, the score rows (``h`` in ``base * h * m``)."""

    scores: np.ndarray
    heads: int


def dynamickv_pooled_scores(
    window_attention: torch.Tensor, kernel_size: int = 7, pooling: str = "avgpool"
) -> torch.Tensor:
    """DynamicKV's pooled scores ``(batch, heads, n - w)`` in float64: the softmaxed window attention ``(batch,
    heads, w, n - w)`` (kvpress's ``compute_window_attention``) summed over the window queries, pooled along the
    keys (:func:`~ripplekv.allocation.per_prompt.pool_keys`)."""
    import torch

    if window_attention.dim() != 4 or window_attention.shape[3] < 1:
        raise ValueError(
            "window_attention must be (batch, heads, window, prefix_keys) with at least one prefix key, got "
            f"shape {tuple(window_attention.shape)}"
        )
    check_pooling("dynamickv_pooled_scores", kernel_size, pooling)
    return pool_keys(window_attention.detach().to(torch.float64).sum(dim=2), kernel_size, pooling)


def dynamickv_layer_statistic(pooled_scores: torch.Tensor, keep: int | None = None) -> DynamicKVStatistic:
    """One layer's DynamicKV statistic from :func:`dynamickv_pooled_scores`, keeping only the ``keep`` highest scores
    when given (the budgets are unchanged while ``keep >= heads * (total - n_layers * window_size)``)."""
    import torch

    if pooled_scores.dim() != 3 or pooled_scores.numel() == 0:
        raise ValueError(f"pooled_scores must be a non-empty (batch, heads, keys) tensor, got {pooled_scores.shape}")
    if keep is not None:
        check_int("dynamickv_layer_statistic.keep", keep, 1)
    values = pooled_scores.detach().to(torch.float64).reshape(-1).cpu().numpy()
    if not np.isfinite(values).all():
        raise ValueError("pooled_scores must be finite")
    ordered = -np.sort(-values, kind="stable")
    if keep is not None:
        ordered = ordered[: int(keep)]
    return DynamicKVStatistic(ordered.copy(), int(pooled_scores.shape[0] * pooled_scores.shape[1]))


def _check_stats(stats: Sequence[Sequence[object]]) -> tuple[list[np.ndarray], int]:
    arrays, heads = [], set()
    for layer, stat in enumerate(stats):
        fields = tuple(stat)
        if len(fields) != 2:
            raise ValueError(f"layer {layer}: a DynamicKV statistic is a pair (scores, heads)")
        array = np.asarray(fields[0], dtype=np.float64).reshape(-1)
        if array.size == 0 or not np.isfinite(array).all():
            raise ValueError(f"layer {layer}: DynamicKV scores must be a non-empty array of finite values")
        check_int(f"DynamicKV statistic of layer {layer}.heads", fields[1], 1)
        arrays.append(array)
        heads.add(int(fields[1]))  # type: ignore[call-overload]
    if len(heads) != 1:
        raise ValueError(f"every layer's DynamicKV statistic must have the same number of heads, got {sorted(heads)}")
    return arrays, heads.pop()


@dataclass(frozen=True)
class DynamicKVRule(PerPromptRule):
    """DynamicKV's allocation (Zhou et al., EMNLP 2025): shares from a progressive global top-k over layers.

    Attributes:
        radio_max: the cap on a layer's selected tokens in multiples of the average (``>= 1``; the authors' name).
        update_interval: layers between two updates; a last update always runs at the last layer.
        kernel_size: width of the pooling (``pooling``: avgpool or maxpool) along the keys (odd).
    """

    radio_max: float = 10.0  # the fields' order is the specs' (``dynamickv:radio_max=2,window=64``): keep it
    update_interval: int = 4
    kernel_size: int = 7
    pooling: str = "avgpool"
    name: ClassVar[str] = "dynamickv"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("window_attention",)
    statistic_names: ClassVar[tuple[str, ...]] = DynamicKVStatistic._fields

    def __post_init__(self) -> None:
        check_pooling("DynamicKVRule", self.kernel_size, self.pooling)
        check_positive("DynamicKVRule", "radio_max", self.radio_max, minimum=1.0, strict=False)
        check_int("DynamicKVRule.update_interval", self.update_interval, 1)

    def layer_statistic(  # type: ignore[override]
        self, window_attention: torch.Tensor, keep: int | None = None
    ) -> DynamicKVStatistic:
        """The statistic of ``window_attention`` ``(batch, heads, w, n - w)``, pooled with this rule's settings."""
        pooled = dynamickv_pooled_scores(window_attention, self.kernel_size, self.pooling)
        return dynamickv_layer_statistic(pooled, keep)

    def update_steps(self, n_layers: int) -> tuple[int, ...]:
        """The numbers of layers seen at each update: every ``update_interval`` layers, and all of them last."""
        steps = list(range(self.update_interval, n_layers + 1, self.update_interval))
        if not steps or steps[-1] != n_layers:
            steps.append(n_layers)
        return tuple(steps)

    def progressive_caps(
        self, stats: Sequence[Sequence[object]], n_layers: int, spare: int, budget_size: int
    ) -> tuple[tuple[int, ...], tuple[Fraction, ...]]:
        """Replay the updates: each layer's cap, and the last update's counts.

        ``spare = total - L * w`` is the selected tokens in all. A layer's cap is the minimum of ``budget_size``
        and its shares ``floor(spare * c_l / sum(c))`` at the updates before the last. An update after ``m`` layers
        takes the top ``spare * h * m // L`` entries (rounded down: ``base`` need not be an integer).
        """
        arrays, heads = _check_stats(stats)
        caps = [int(budget_size)] * n_layers
        counts: tuple[Fraction, ...] = (Fraction(0),) * n_layers
        for seen in self.update_steps(n_layers):
            counts = top_k_counts(arrays[:seen], (spare * heads * seen) // n_layers)
            if seen == n_layers:
                break
            mass = sum(counts)
            if mass == 0:
                continue
            for layer in range(seen):
                caps[layer] = min(caps[layer], math.floor(spare * counts[layer] / mass))
        return tuple(caps), counts

    def layer_budgets(
        self,
        n_layers: int,
        prompt_tokens: int,
        floor: int,
        *,
        stats: Sequence[Sequence[object]],
        total: int,
        window_size: int,
    ) -> tuple[int, ...]:
        """The window plus a share of ``total - L * w`` by the last update's counts, under the replayed caps."""
        check_rule_call(n_layers, prompt_tokens, floor, stats=stats, total=total, window_size=window_size)
        # invalid statistics are an error at every total, before the even-split shortcut
        arrays, heads = _check_stats(stats)
        longest = max(a.size for a in arrays)
        if window_size < prompt_tokens and longest > heads * (prompt_tokens - window_size):
            raise ValueError(
                f"a DynamicKV statistic has {longest} scores, more than heads * (prompt_tokens - window_size) = "
                f"{heads} * {prompt_tokens - window_size}: it was computed for another prompt length or window"
            )
        spare = total - n_layers * window_size
        if spare <= 0 or window_size >= prompt_tokens:
            return even_split(total, n_layers)
        budget_size = min(int(float(self.radio_max) * Fraction(spare, n_layers)), prompt_tokens - window_size)
        caps, counts = self.progressive_caps(stats, n_layers, spare, budget_size)
        if sum(counts) == 0:
            return even_split(total, n_layers)
        low = layer_floor(n_layers, prompt_tokens, floor, total=total, window_size=window_size)
        for limit in (caps, (budget_size,) * n_layers, (prompt_tokens,) * n_layers):
            highs = [max(low, min(prompt_tokens, window_size + cap)) for cap in limit]
            if sum(highs) >= total:
                break
        return apportion([window_size] * n_layers, counts, total, [low] * n_layers, highs)
