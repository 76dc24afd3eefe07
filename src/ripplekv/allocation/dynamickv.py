"""DynamicKV's per-layer budgets: a global top-k of window-attention scores over the layers seen so far.

Paper: Zhou et al., "DynamicKV: Task-Aware Adaptive KV Cache Compression for Long Context LLMs", EMNLP 2025,
arXiv:2412.14838.

Source read: github.com/DreamMr/DynamicKV at commit ``8ab3c08d4f0a93ef3322e267e1faa03c4e12fd24``:
``kv_compression/token_drop/methods/dynamic_v11.py`` (``DynamicKVClusterV11.budget_compute_per_layer``: the
statistic; ``update_and_reset_budget``: the budgets; ``init_dynamickv_V11``: fallbacks),
``kv_compression/token_drop/llama_model_impl/dynamickv_v11.py`` (when updates run, what is kept between them),
``run/longbench/scripts/run_llama/run_llama3_8b_dynamic_v11.2_max_radio_10.sh`` (the settings run).

Formula. ``L`` layers, a prompt of ``n`` tokens, window ``w``, ``base = C - w`` selected tokens per layer on
average (``C`` the uniform per-layer budget), ``h`` query heads.

* Statistic of layer ``l``: the pooled window attention ``S_l[h, j] = pool_j(sum_i A[h, i, j])``: the
  softmaxed attention of the ``w`` window queries summed over those queries, for each prefix key ``j`` and
  head, smoothed along the keys by an average (or max) pool of width ``kernel_size`` (stride 1, zero padding,
  ``count_include_pad``). Each layer keeps its ``budget_size = min(int(radio_max * base), n - w)`` best tokens
  per head.
* Progressive update: after every 4th layer (``m = 4, 8, ...`` layers seen) the scores of all ``m`` seen
  layers are pooled into one list and its global top ``base * h * m`` entries are taken; layer ``l``'s count
  ``c_l`` is how many of them are its own. Each seen layer then keeps
  ``base * L * c_l / sum(c)`` selected tokens (a share of the *whole-model* total ``base * L``), plus its window.
* What earlier updates constrain: between updates the code truncates each seen layer's cache (its top tokens,
  best first) to that share, and a later update can only truncate it further (asking for more returns the
  tokens already kept, padded with duplicated window tokens). So a layer keeps the *minimum* of its shares
  over every update that saw it, and at most ``budget_size``. Its count in a later update is recomputed from
  its full scores (never from the truncated cache), so only that minimum carries over.

Defaults (the Llama script, SmolLM2-135M being a Llama-architecture model): ``kernel_size = 7``,
``pooling = "avgpool"``, ``radio_max = 10``, updates every 4 layers (the code's ``layer_idx % 4 == 3``). The
scripts use ``window_size = 8``; the window here is the scorer's (see below). Nothing is depth-specific except
the update schedule, whose consequence for 30 layers is the second deviation below.

Deviations from the authors' code:

* Shared window: the statistic is computed over the token scorer's observation window (SnapKV's 64 by
  default) instead of DynamicKV's 8, so that the window the budgets reserve is the one the scorer keeps.
* A last update at the last layer: the code updates only when ``layer_idx % 4 == 3``, so for 30 layers the
  last update is after layer 27 and layers 28-29 keep ``budget_size`` (up to ten times the average) and the
  total is exceeded; the authors' models (28 or 32 layers) are multiples of 4. Here the final update always
  runs over all ``L`` layers, with ``tk = base * h * L``.
* One pass after the prefill: the updates are replayed from the stored statistics once the last layer is
  seen, which gives exactly the minimum-over-updates budgets above (no update reads a truncated cache).
* Exact total: the code rounds each share down (``int(budget_size * c / sum c)``, rescaled by its sum, the
  remainder to the last seen layer), divides the counts by ``m`` with integer division, and loses whatever
  the earlier minimum removes. Here the final shares ``w + t * c_l`` are solved exactly with each layer capped
  at ``w`` plus its earlier minimum and ``budget_size`` (proportional water-filling: what a capped layer
  cannot take goes to the others in proportion to their counts), within ``[max(floor, w), n]``, rounded by
  largest remainder. If those caps cannot hold the total, the earlier minima are dropped (then, if still
  needed, ``budget_size``). The intermediate shares are ``floor(base * L * c_l / sum(c))``.
* Ties: ``torch.topk`` breaks ties at the threshold arbitrarily; here the entries tied at the threshold share
  the remaining slots in proportion to how many each layer has (fractional counts), so equal layers get equal
  counts.
* Non-integer ``base``: ``base * h * m`` is rounded down when ``total - L * w`` is not a multiple of ``L``.
* Precision and batch: scores are pooled in float64; a batch's entries are pooled with the heads (``h`` is
  then batch times heads), so its prompts share one set of budgets. The statistic is the layer's whole sorted
  score list (``h * (n - w)`` floats: the global top-k has no smaller exact summary); pass ``keep`` to
  :func:`dynamickv_layer_statistic` to store only the best entries (exact while ``keep >= h * (total - L w)``).
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
    check_int,
    check_pooling,
    check_positive,
    check_rule_call,
    even_split,
    layer_floor,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "DynamicKVRule",
    "DynamicKVStatistic",
    "dynamickv_layer_statistic",
    "dynamickv_pooled_scores",
    "global_topk_counts",
]


class DynamicKVStatistic(NamedTuple):
    """One layer's DynamicKV statistic.

    Attributes:
        scores: the layer's pooled window-attention scores over all heads and prefix keys, flattened and
            sorted in decreasing order (float64; possibly only the best ``keep`` of them).
        heads: the number of score rows (query heads, times the batch size), ``h`` in ``base * h * m``.
    """

    scores: np.ndarray
    heads: int


def dynamickv_pooled_scores(
    window_attention: torch.Tensor, kernel_size: int = 7, pooling: str = "avgpool"
) -> torch.Tensor:
    """DynamicKV's pooled scores: window attention summed over the window queries, pooled along the keys.

    Args:
        window_attention: softmaxed window attention ``(batch, heads, w, n - w)`` over the prefix keys, one row
            per query head (kvpress's ``SnapKVPress.compute_window_attention``).
        kernel_size: the pooling width (odd, ``>= 1``).
        pooling: ``"avgpool"`` (zero padding counted, as ``F.avg_pool1d``) or ``"maxpool"``.

    Returns:
        ``(batch, heads, n - w)`` float64 scores.

    Raises:
        ValueError: on a tensor that is not 4-D or has no prefix key, an even kernel or an unknown pooling.
    """
    import torch
    from torch.nn import functional as F

    if window_attention.dim() != 4 or window_attention.shape[3] < 1:
        raise ValueError(
            "window_attention must be (batch, heads, window, prefix_keys) with at least one prefix key, got "
            f"shape {tuple(window_attention.shape)}"
        )
    check_pooling("dynamickv_pooled_scores", kernel_size, pooling)
    summed = window_attention.detach().to(torch.float64).sum(dim=2)
    batch, heads, keys = summed.shape
    flat = summed.reshape(batch * heads, 1, keys)
    pad = kernel_size // 2
    if pooling == "avgpool":
        pooled = F.avg_pool1d(flat, kernel_size=kernel_size, padding=pad, stride=1)
    else:
        pooled = F.max_pool1d(flat, kernel_size=kernel_size, padding=pad, stride=1)
    return pooled.reshape(batch, heads, keys)


def dynamickv_layer_statistic(pooled_scores: torch.Tensor, keep: int | None = None) -> DynamicKVStatistic:
    """One layer's DynamicKV statistic from its pooled window-attention scores.

    Args:
        pooled_scores: ``(batch, heads, n - w)`` pooled scores per query head and prefix key
            (:func:`dynamickv_pooled_scores`).
        keep: store only the ``keep`` highest scores (``>= 1``; default: all). The budgets are unchanged as long
            as ``keep >= heads * (total - n_layers * window)``, the most entries one layer can count.

    Returns:
        ``DynamicKVStatistic(scores sorted in decreasing order as float64, heads = batch * heads)``.

    Raises:
        ValueError: if the tensor is not 3-D, is empty, holds non-finite values, or ``keep < 1``.
    """
    import torch

    if pooled_scores.dim() != 3 or pooled_scores.numel() == 0:
        raise ValueError(f"pooled_scores must be a non-empty (batch, heads, keys) tensor, got {pooled_scores.shape}")
    if keep is not None:
        check_int("dynamickv_layer_statistic", "keep", keep, 1)
    values = pooled_scores.detach().to(torch.float64).reshape(-1).cpu().numpy()
    if not np.isfinite(values).all():
        raise ValueError("pooled_scores must be finite")
    ordered = -np.sort(-values, kind="stable")
    if keep is not None:
        ordered = ordered[: int(keep)]
    return DynamicKVStatistic(ordered.copy(), int(pooled_scores.shape[0] * pooled_scores.shape[1]))


def global_topk_counts(scores: Sequence[np.ndarray], k: int) -> tuple[Fraction, ...]:
    """How many of the ``k`` highest entries of all the lists together each list holds.

    Entries tied at the ``k``-th value share the slots left in proportion to how many each list has, so the
    counts are exact fractions summing to ``min(k, all entries)``.

    Args:
        scores: one 1-D array of finite scores per layer.
        k: the number of top entries (``>= 0``).

    Returns:
        One count per list.
    """
    arrays = [np.asarray(s, dtype=np.float64).reshape(-1) for s in scores]
    entries = sum(a.size for a in arrays)
    if k <= 0 or entries == 0:
        return (Fraction(0),) * len(arrays)
    if k >= entries:
        return tuple(Fraction(a.size) for a in arrays)
    joined = np.concatenate(arrays)
    threshold = np.partition(joined, entries - k)[entries - k]  # the k-th largest value
    above = [int(np.count_nonzero(a > threshold)) for a in arrays]
    tied = [int(np.count_nonzero(a == threshold)) for a in arrays]
    left = k - sum(above)
    return tuple(Fraction(up) + Fraction(left * tie, sum(tied)) for up, tie in zip(above, tied))


def _check_stats(stats: Sequence[Sequence[object]]) -> tuple[list[np.ndarray], int]:
    arrays, heads = [], set()
    for layer, stat in enumerate(stats):
        fields = tuple(stat)
        if len(fields) != 2:
            raise ValueError(f"layer {layer}: a DynamicKV statistic is a pair (scores, heads)")
        array = np.asarray(fields[0], dtype=np.float64).reshape(-1)
        if array.size == 0 or not np.isfinite(array).all():
            raise ValueError(f"layer {layer}: DynamicKV scores must be a non-empty array of finite values")
        check_int(f"DynamicKV statistic of layer {layer}", "heads", fields[1], 1)
        arrays.append(array)
        heads.add(int(fields[1]))  # type: ignore[call-overload]
    if len(heads) != 1:
        raise ValueError(f"every layer's DynamicKV statistic must have the same number of heads, got {sorted(heads)}")
    return arrays, heads.pop()


@dataclass(frozen=True)
class DynamicKVRule(PerPromptRule):
    """DynamicKV's allocation (Zhou et al., EMNLP 2025): shares from a progressive global top-k over layers.

    See the module docstring for the formula, the source and every deviation.

    Attributes:
        kernel_size: width of the pooling along the keys (odd, ``>= 1``; default 7).
        pooling: ``"avgpool"`` (default) or ``"maxpool"``.
        radio_max: the cap ``budget_size = min(int(radio_max * base), n - w)`` on a layer's selected tokens,
            in multiples of the average (finite, ``>= 1``; default 10; the authors' name).
        update_interval: layers between two updates (an integer ``>= 1``; default 4); a last update always
            runs at the last layer.
    """

    kernel_size: int = 7
    pooling: str = "avgpool"
    radio_max: float = 10.0
    update_interval: int = 4
    name: ClassVar[str] = "dynamickv"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("window_attention",)
    statistic_names: ClassVar[tuple[str, ...]] = DynamicKVStatistic._fields

    def __post_init__(self) -> None:
        check_pooling("DynamicKVRule", self.kernel_size, self.pooling)
        check_positive("DynamicKVRule", "radio_max", self.radio_max, minimum=1.0, strict=False)
        check_int("DynamicKVRule", "update_interval", self.update_interval, 1)

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
        """Replay the updates: each layer's minimum intermediate share, and the final counts.

        Args:
            stats: one ``(scores, heads)`` per layer.
            n_layers: number of layers ``L``.
            spare: selected tokens in all, ``total - L * w`` (``base * L``).
            budget_size: the per-layer cap on selected tokens.

        Returns:
            ``(caps, counts)``: per layer the minimum of ``budget_size`` and of its shares
            ``floor(spare * c_l / sum(c))`` at the updates before the last, and the last update's counts.
        """
        arrays, heads = _check_stats(stats)
        caps = [int(budget_size)] * n_layers
        counts: tuple[Fraction, ...] = (Fraction(0),) * n_layers
        for seen in self.update_steps(n_layers):
            counts = global_topk_counts(arrays[:seen], (spare * heads * seen) // n_layers)
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
        stats: Sequence[Sequence[object]],
        n_layers: int,
        prompt_tokens: int,
        total: int,
        window: int,
        floor: int,
    ) -> tuple[int, ...]:
        """DynamicKV's budgets: the window plus a share of ``total - L * w`` by the last update's counts.

        Args:
            stats: one ``(scores, heads)`` per layer.
            n_layers: number of layers.
            prompt_tokens: prompt length; also the per-layer cap.
            total: global number of kept tokens.
            window: the scorer's observation window ``w``, kept by every layer.
            floor: smallest budget per layer.

        Returns:
            ``n_layers`` integers summing to ``total``, in ``[layer_floor(...), prompt_tokens]``.

        Raises:
            ValueError: on invalid arguments or statistics.
        """
        check_rule_call(stats, n_layers, prompt_tokens, total, window, floor)
        # invalid statistics are an error at every total, before the even-split shortcut
        arrays, heads = _check_stats(stats)
        longest = max(a.size for a in arrays)
        if window < prompt_tokens and longest > heads * (prompt_tokens - window):
            raise ValueError(
                f"a DynamicKV statistic has {longest} scores, more than heads * (prompt_tokens - window) = "
                f"{heads} * {prompt_tokens - window}: it was computed for another prompt length or window"
            )
        spare = total - n_layers * window
        if spare <= 0 or window >= prompt_tokens:
            return even_split(total, n_layers)
        budget_size = min(int(float(self.radio_max) * Fraction(spare, n_layers)), prompt_tokens - window)
        caps, counts = self.progressive_caps(stats, n_layers, spare, budget_size)
        if sum(counts) == 0:
            return even_split(total, n_layers)
        low = layer_floor(n_layers, prompt_tokens, total, window, floor)
        for limit in (caps, (budget_size,) * n_layers, (prompt_tokens,) * n_layers):
            highs = [max(low, min(prompt_tokens, window + cap)) for cap in limit]
            if sum(highs) >= total:
                break
        return apportion([window] * n_layers, counts, total, [low] * n_layers, highs)
