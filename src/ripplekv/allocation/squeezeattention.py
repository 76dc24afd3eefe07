"""SqueezeAttention's per-layer budgets: cluster layers by how little their attention changes the residual.

Wang, Cui and Gan, ICLR 2025, arXiv:2404.04793 (github.com/hetailang/SqueezeAttention @ ``a1933d1``). Layer ``l``'s
similarity is ``s_l = mean_t cos(h_in[t], h_in[t] + o[t])`` (``h_in`` the residual entering the layer, ``o`` its
attention output); the highest of 3 k-means clusters ("class 3") keeps ``p`` times the average budget and the
other layers share the rest equally. Default ``p = 8 / 21``: the README's ``--ini_size 0.21 --KV_class3 0.08``.
Deviations (exact k-means, exact total and bounds, batch averaged): docs/allocators.md, "SqueezeAttention".
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
    check_positive,
    check_rule_call,
    even_split,
    finite_array,
    layer_floor,
)
from ripplekv.validation import check_int

if TYPE_CHECKING:
    import torch

DEFAULT_SQUEEZE_P: float = 8 / 21
"""Class 3's budget relative to the average: the README's ``--KV_class3 0.08`` at ``--ini_size 0.21``."""

COSINE_EPS: float = 1e-8
"""Norm clamp of the cosine (``torch.nn.functional.cosine_similarity``'s default eps)."""


class SqueezeStatistic(NamedTuple):
    """One layer's SqueezeAttention statistic: ``s_l``, the mean over prompt tokens of ``cos(h_in, h_in + o)``."""

    similarity: float


def squeeze_token_similarities(residual_in: torch.Tensor, attention_output: torch.Tensor) -> torch.Tensor:
    """Per-token similarities ``cos(h_in[t], h_in[t] + o[t])`` of one layer, ``(batch, tokens)`` in float64, from
    ``(batch, tokens, hidden)`` ``residual_in`` and ``attention_output``; ValueError on bad shapes or values."""
    import torch

    if residual_in.dim() != 3 or residual_in.shape != attention_output.shape:
        raise ValueError(
            "residual_in and attention_output must both be (batch, tokens, hidden), got shapes "
            f"{tuple(residual_in.shape)} and {tuple(attention_output.shape)}"
        )
    if residual_in.shape[1] < 1:
        raise ValueError("residual_in has no token")
    before = residual_in.detach().to(torch.float64)
    after = before + attention_output.detach().to(torch.float64)
    if not bool(torch.isfinite(after).all()) or not bool(torch.isfinite(before).all()):
        raise ValueError("residual_in and attention_output must be finite")
    dot = (before * after).sum(dim=-1)
    norms = before.norm(dim=-1).clamp_min(COSINE_EPS) * after.norm(dim=-1).clamp_min(COSINE_EPS)
    return dot / norms


def squeeze_statistic_of_similarities(parts: Sequence[torch.Tensor]) -> SqueezeStatistic:
    """``s_l`` from the per-token similarities of consecutive parts of the prompt: one mean over every token."""
    import torch

    if not parts:
        raise ValueError("no per-token similarities to average")
    similarities = parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=-1)
    return SqueezeStatistic(float(similarities.mean()))


def squeeze_layer_statistic(residual_in: torch.Tensor, attention_output: torch.Tensor) -> SqueezeStatistic:
    """SqueezeAttention's similarity of one layer, averaged over the batch too, in float64, from the decoder layer's
    input ``residual_in`` (not the normalised hidden states kvpress's hook sees) and the attention's output."""
    return squeeze_statistic_of_similarities([squeeze_token_similarities(residual_in, attention_output)])


def _optimal_bounds(ordered: np.ndarray, counts: np.ndarray, k: int) -> list[int]:
    """The inner bounds ``b_1 < ... < b_{k-1}`` (``b_0 = 0``, ``b_k = m``) of the least-squares split of ``m``
    distinct sorted values (``counts`` copies each): it maximises ``sum_j S_j^2 / n_j`` in exact integers (floats
    are dyadic; ``lcm(1..n)`` clears every ``n_j``), ties to the largest last bound, then the one below it, and so on.
    """
    exact = [Fraction(v) for v in ordered.tolist()]
    scale = max(f.denominator for f in exact)
    units = [f.numerator * (scale // f.denominator) for f in exact]  # value * scale, exactly
    multiple = math.lcm(*range(1, int(counts.sum()) + 1))
    sums, sizes = [0], [0]
    for unit, count in zip(units, counts.tolist()):
        sums.append(sums[-1] + count * unit)
        sizes.append(sizes[-1] + count)
    m = len(units)

    def gain(lo: int, hi: int) -> int:  # S^2 / n of ordered[lo:hi], times `multiple` (an integer)
        total = sums[hi] - sums[lo]
        return total * total * (multiple // (sizes[hi] - sizes[lo]))

    best = [[gain(0, i) if i else 0 for i in range(m + 1)]]  # best[j][i]: j + 1 clusters over ordered[:i]
    for j in range(1, k):
        previous = best[-1]
        best.append([0] * (j + 1) + [max(previous[t] + gain(t, i) for t in range(j, i)) for i in range(j + 1, m + 1)])
    bounds = [m]
    for j in range(k - 1, 0, -1):
        hi = bounds[-1]
        bounds.append(max(t for t in range(j, hi) if best[j - 1][t] + gain(t, hi) == best[j][hi]))
    return bounds[:0:-1]


def kmeans_1d(values: Sequence[float], n_clusters: int = 3) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Exact 1-D k-means into ``min(n_clusters, distinct values)`` clusters: ``(labels, centres)``, centres increasing.

    An optimal split cuts the sorted values into runs, so a dynamic programme over the sorted distinct values finds
    the optimum scikit-learn's ``KMeans`` aims at, for certain (:func:`_optimal_bounds`); among equally good splits
    the highest cluster is the smallest (squeezing the fewest layers). ValueError on no or non-finite values.
    """
    array = finite_array(values, "values to cluster", nonnegative=False)
    if array.size == 0:
        raise ValueError("kmeans_1d needs at least one value")
    check_int("kmeans_1d.n_clusters", n_clusters, 1)
    ordered, counts = np.unique(array, return_counts=True)
    k = min(int(n_clusters), int(ordered.size))
    cuts = _optimal_bounds(ordered, counts, k)
    run = np.searchsorted(ordered, array)  # each value's index among the distinct values
    labels = np.searchsorted(np.asarray(cuts), run, side="right")
    centres = tuple(math.fsum(v.tolist()) / v.size for v in (array[labels == c] for c in range(k)))  # exact means
    return tuple(int(label) for label in labels), centres


def squeeze_groups(similarities: Sequence[float], n_clusters: int = 3) -> tuple[bool, ...]:
    """One flag per layer: in SqueezeAttention's "class 3", the highest-similarity cluster (none if only one)."""
    labels, centres = kmeans_1d(similarities, n_clusters)
    if len(centres) < 2:
        return (False,) * len(labels)
    top = len(centres) - 1
    return tuple(label == top for label in labels)


@dataclass(frozen=True)
class SqueezeAttentionRule(PerPromptRule):
    """SqueezeAttention's allocation (Wang et al., ICLR 2025): squeeze the least important cluster of layers.

    Attributes:
        p: class 3's budget as a fraction of the average per-layer budget (``0 < p <= 1``; ``1`` is uniform).
        n_clusters: k-means clusters over the layers' similarities (``>= 2``).
    """

    p: float = DEFAULT_SQUEEZE_P
    n_clusters: int = 3
    name: ClassVar[str] = "squeezeattention"
    statistic_inputs: ClassVar[tuple[str, ...]] = ("residual_in", "attention_output")
    statistic_names: ClassVar[tuple[str, ...]] = SqueezeStatistic._fields

    def __post_init__(self) -> None:
        check_positive("SqueezeAttentionRule", "p", self.p)
        if float(self.p) > 1:
            raise ValueError(f"SqueezeAttentionRule.p must be <= 1 (class 3 is squeezed), got {self.p!r}")
        check_int("SqueezeAttentionRule.n_clusters", self.n_clusters, 2)

    def layer_statistic(  # type: ignore[override]
        self, residual_in: torch.Tensor, attention_output: torch.Tensor
    ) -> SqueezeStatistic:
        """:func:`squeeze_layer_statistic` (the caller supplies the decoder layer's input)."""
        return squeeze_layer_statistic(residual_in, attention_output)

    def token_statistic(self, residual_in: torch.Tensor, attention_output: torch.Tensor) -> torch.Tensor:
        """:func:`squeeze_token_similarities`: the per-token values :meth:`layer_statistic` averages."""
        return squeeze_token_similarities(residual_in, attention_output)

    def statistic_from_tokens(self, parts: Sequence[torch.Tensor]) -> SqueezeStatistic:
        """:func:`squeeze_statistic_of_similarities` over consecutive parts' :meth:`token_statistic`, in order."""
        return squeeze_statistic_of_similarities(parts)

    def weights(self, similarities: Sequence[float]) -> tuple[Fraction, ...]:
        """Each layer's budget relative to the average: ``p`` in class 3, ``(L - m p) / (L - m)`` elsewhere."""
        squeezed = squeeze_groups(similarities, self.n_clusters)
        n, m = len(squeezed), sum(squeezed)
        p = Fraction(float(self.p))
        if m == 0:
            return (Fraction(1),) * n
        rest = (n - m * p) / (n - m)
        return tuple(p if flag else rest for flag in squeezed)

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
        """The :meth:`weights` shared out over ``total``; never larger for a layer of higher similarity."""
        check_rule_call(n_layers, prompt_tokens, floor, stats=stats, total=total, window_size=window_size)
        if any(len(tuple(s)) != 1 for s in stats):
            raise ValueError("every SqueezeAttention statistic must be a 1-tuple (similarity,)")
        similarity = finite_array([tuple(s)[0] for s in stats], "SqueezeAttention similarities", nonnegative=False)
        weights = self.weights(similarity)
        if len(set(weights)) == 1:
            return even_split(total, n_layers)
        low = layer_floor(n_layers, prompt_tokens, floor, total=total, window_size=window_size)
        bounds = ([low] * n_layers, [prompt_tokens] * n_layers)
        return apportion([0] * n_layers, weights, total, *bounds, preference=[-s for s in similarity])
