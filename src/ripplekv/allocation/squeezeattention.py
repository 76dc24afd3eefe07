"""SqueezeAttention's per-layer budgets: cluster layers by how little their attention changes the residual.

Paper: Wang, Cui and Gan, "SqueezeAttention: 2D Management of KV-Cache in LLM Inference via Layer-wise
Optimal Budget", ICLR 2025, arXiv:2404.04793.

Source read: github.com/hetailang/SqueezeAttention at commit ``a1933d18b09c668312cbabdfd7b1fa73888c0f6f``:
``utils_hh/modify_llama_drop.py`` (``LlamaDecoderLayer_squeeze.forward``: the statistic;
``LlamaModel_squeeze.forward``: the clustering and the budgets), ``pred.py`` (``--ini_size``,
``--KV_class3``), ``README.md`` and ``script/*.sh`` (the settings the authors run).

Formula. For layer ``l`` with residual stream ``h_in`` entering the layer (before its input norm) and
attention output ``o = Attn(LN(h_in))`` (after the output projection):

* similarity ``s_l = mean_t cos(h_in[t], h_in[t] + o[t])`` over the prompt tokens ``t``: a layer whose
  attention barely turns the residual matters less;
* KMeans with 3 clusters over the ``L`` scalars ``s_l``; the cluster with the highest centre ("class 3", the
  least important layers) gets a budget of ``p_abs * n`` tokens per layer (``--KV_class3``), and the other
  layers share the rest of the total ``L * ini_size * n`` equally:
  ``a = (L * ini_size - |class 3| * p_abs) / (L - |class 3|)`` of the prompt each.

Defaults. ``p = 8 / 21`` (about 0.381), with ``p`` the class-3 budget *relative to the average budget*
(``p_abs = p * ini_size``): the README's recommended LongBench run (Mistral-7B, ``--ini_size 0.21
--KV_class3 0.08``, "a parameter where SqueezeAttention can significantly improve score"). The code's
``--KV_class3`` is an absolute fraction of the prompt, which has no meaning across budgets (``pred.py``'s
default 1.0 would give the other layers a negative budget), so the ratio is what transfers; the authors' other
setting (Llama-2-7B on XSum, 0.25 / 0.4 = 0.625) is the alternative. Nothing in the source is specific to a
model's depth, so the same value applies to SmolLM2-135M's 30 layers. ``n_clusters = 3`` as in the code.

Deviations from the authors' code:

* Exact clustering: the code's ``KMeans(n_clusters=3)`` (scikit-learn: Lloyd iterations from k-means++ starts, the
  best of ``n_init`` of them: 10 before scikit-learn 1.4, one from 1.4 on; the code pins no version) aims at the
  least-squares split of the ``L`` similarities, which :func:`kmeans_1d` computes exactly (dynamic programming over
  the sorted values in exact integer arithmetic), so a prompt always gets the same budgets, whatever the layers'
  order. On 172 real SmolLM2 prompts (the 140 of the RULER-4K allocator run, 32 of LongBench's) scikit-learn 1.9
  reached that optimum in all 8600 fits with ``n_init=10`` (50 seeds each) and in 8328 with one start. What
  remains different: a fit that misses the optimum (one start) gives the code a worse split; among equally good
  splits (exact ties, never seen on real statistics) this takes the smallest class 3, then the smallest middle
  cluster, scikit-learn whichever its start reaches; fewer distinct values than clusters give fewer clusters
  (scikit-learn warns), and a single cluster (all similarities equal) gives uniform budgets.
* Exact total and bounds: the code sets ``int(p_abs * n)`` and ``int(a * n)`` per layer (the sum misses the
  total by up to ``L`` tokens and nothing caps a layer at the prompt). Here class 3 has weight ``p`` and the
  others ``(L - |class 3| p) / (L - |class 3|)``, shared out by exact proportional water-filling within
  ``[max(floor, window), n]`` and rounded by largest remainder (ties: the lower similarity first): when no
  bound binds the real shares are exactly the code's ``p_abs * n`` and ``a * n``.
* Input: the code records ``h_in`` and ``h_in + o`` for batch size 1 (it squeezes the batch); here a batch is
  averaged over, so all its prompts share one set of budgets. The cosine is computed in float64 with each
  norm clamped at ``1e-8`` (``torch.nn.functional.cosine_similarity``'s eps).
* Scorer: the code pairs the budgets with StreamingLLM / H2O / sliding windows; here the token scorer is the
  press's (SnapKV), and every layer keeps at least its observation window.
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
    check_positive,
    check_rule_call,
    even_split,
    finite_array,
    layer_floor,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_SQUEEZE_P",
    "SqueezeAttentionRule",
    "SqueezeStatistic",
    "kmeans_1d",
    "squeeze_groups",
    "squeeze_layer_statistic",
    "squeeze_statistic_of_similarities",
    "squeeze_token_similarities",
]

DEFAULT_SQUEEZE_P: float = 8 / 21
"""Class 3's budget relative to the average: the README's ``--KV_class3 0.08`` at ``--ini_size 0.21``."""

COSINE_EPS: float = 1e-8
"""Norm clamp of the cosine (``torch.nn.functional.cosine_similarity``'s default eps)."""


class SqueezeStatistic(NamedTuple):
    """One layer's SqueezeAttention statistic.

    Attributes:
        similarity: ``s_l``, the mean over prompt tokens of ``cos(h_in, h_in + attention_output)``.
    """

    similarity: float


def squeeze_token_similarities(residual_in: torch.Tensor, attention_output: torch.Tensor) -> torch.Tensor:
    """SqueezeAttention's per-token similarities ``cos(h_in[t], h_in[t] + o[t])`` of one layer, in float64.

    What :func:`squeeze_layer_statistic` averages; a prefill run in chunks computes them per chunk and averages
    them once over the prompt (:func:`squeeze_statistic_of_similarities`).

    Args:
        residual_in: ``h_in``, the residual stream entering the layer, ``(batch, tokens, hidden)``.
        attention_output: ``o``, the attention block's output for the same tokens, ``(batch, tokens, hidden)``.

    Returns:
        ``(batch, tokens)`` float64 cosines.

    Raises:
        ValueError: if the shapes differ, are not 3-D, have no token, or hold non-finite values.
    """
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
    """The similarity ``s_l`` from the per-token similarities of consecutive parts of the prompt.

    One mean over every token of every part (the parts joined in order), the same reduction
    :func:`squeeze_layer_statistic` makes over the whole prompt: never a mean of the parts' means.

    Args:
        parts: ``(batch, tokens_i)`` similarities (:func:`squeeze_token_similarities`), at least one.
    """
    import torch

    if not parts:
        raise ValueError("no per-token similarities to average")
    similarities = parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=-1)
    return SqueezeStatistic(float(similarities.mean()))


def squeeze_layer_statistic(residual_in: torch.Tensor, attention_output: torch.Tensor) -> SqueezeStatistic:
    """SqueezeAttention's similarity of one layer: how little its attention turns the residual stream.

    The caller must supply the decoder layer's *input* residual stream, which kvpress's attention hook does not
    see (its ``hidden_states`` are already normalised by the layer's input norm). Either register a forward
    pre-hook on the decoder layer (``model.model.layers[l]``) and keep its first argument, or take the input of
    ``post_attention_layernorm`` (which is ``h_in + o``) together with the attention module's output. The
    attention output is the first element of the attention module's forward output (after ``o_proj``), before
    any residual add.

    Args:
        residual_in: ``h_in``, the residual stream entering the layer, ``(batch, tokens, hidden)``.
        attention_output: ``o``, the attention block's output for the same tokens, ``(batch, tokens, hidden)``.

    Returns:
        ``SqueezeStatistic(mean_t cos(h_in[t], h_in[t] + o[t]))``, averaged over the batch too, in float64.

    Raises:
        ValueError: if the shapes differ, are not 3-D, have no token, or hold non-finite values.
    """
    return squeeze_statistic_of_similarities([squeeze_token_similarities(residual_in, attention_output)])


def _mean(values: np.ndarray) -> float:
    """The correctly rounded mean (``math.fsum``), independent of the values' order."""
    return math.fsum(values.tolist()) / values.size


def _optimal_bounds(ordered: np.ndarray, counts: np.ndarray, k: int) -> list[int]:
    """Bounds ``0 = b_0 < b_1 < ... < b_k = m`` of the least-squares split of ``m`` distinct sorted values.

    Cluster ``j`` is ``ordered[b_j : b_{j+1}]`` (with ``counts`` copies of each value). The total within-cluster
    sum of squares is ``sum x^2 - sum_j S_j^2 / n_j`` (``S_j`` the cluster's sum, ``n_j`` its count), so the split
    maximises ``sum_j S_j^2 / n_j``. Every value is an integer multiple of one power of two (floats are dyadic),
    and ``lcm(1..n)`` clears every ``n_j``: the dynamic programme compares exact integers, so equally good splits
    are exactly equal and the tie rule decides between them. Tie rule: the last bound as large as possible (the
    highest cluster as small as possible), then the one below it, and so on.
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
    return [0, *reversed(bounds)]


def kmeans_1d(values: Sequence[float], n_clusters: int = 3) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Exact 1-D k-means: the split into clusters with the least total within-cluster sum of squares.

    ``k = min(n_clusters, distinct values)`` clusters. In one dimension an optimal split cuts the sorted values
    into ``k`` runs and never separates equal values (copies of a value in two clusters: moving one from the
    cluster of the farther centre lowers the sum, or, if the centres are equal, merging the two and splitting a
    cluster of two distinct values does; tests/test_squeeze_kmeans.py checks every partition of small inputs), so
    a dynamic programme over the sorted distinct values (weighted by their copies) finds the optimum, in exact
    integer arithmetic (see :func:`_optimal_bounds`): the least-squares optimum scikit-learn's ``KMeans`` aims at,
    found for certain rather than from random starts. Among equally good splits the highest cluster is the
    smallest one, then the next below it, and so on (a rule on the sorted values, so independent of their order;
    for SqueezeAttention it squeezes the fewest layers). A centre is the mean of its values (``math.fsum``).

    Args:
        values: the finite values to cluster (at least one).
        n_clusters: the requested number of clusters (``>= 1``).

    Returns:
        ``(labels, centres)``: a cluster label per value, and the clusters' centres in increasing order
        (label ``k`` has the ``k``-th smallest centre).

    Raises:
        ValueError: on no value, a non-finite value or ``n_clusters < 1``.
    """
    array = finite_array(values, "values to cluster", nonnegative=False)
    if array.size == 0:
        raise ValueError("kmeans_1d needs at least one value")
    check_int("kmeans_1d", "n_clusters", n_clusters, 1)
    ordered, counts = np.unique(array, return_counts=True)
    k = min(int(n_clusters), int(ordered.size))
    bounds = _optimal_bounds(ordered, counts, k)
    run = np.searchsorted(ordered, array)  # each value's index among the distinct values
    labels = np.searchsorted(np.asarray(bounds[1:-1]), run, side="right")
    centres = tuple(_mean(array[labels == c]) for c in range(k))
    return tuple(int(label) for label in labels), centres


def squeeze_groups(similarities: Sequence[float], n_clusters: int = 3) -> tuple[bool, ...]:
    """Which layers are in SqueezeAttention's "class 3" (the cluster of highest similarity).

    Args:
        similarities: one finite ``s_l`` per layer.
        n_clusters: the number of KMeans clusters (the authors use 3).

    Returns:
        One flag per layer: ``True`` for the highest cluster. All ``False`` when the values form a single
        cluster (all equal).
    """
    labels, centres = kmeans_1d(similarities, n_clusters)
    if len(centres) < 2:
        return (False,) * len(labels)
    top = len(centres) - 1
    return tuple(label == top for label in labels)


@dataclass(frozen=True)
class SqueezeAttentionRule(PerPromptRule):
    """SqueezeAttention's allocation (Wang et al., ICLR 2025): squeeze the least important cluster of layers.

    See the module docstring for the formula, the source and every deviation.

    Attributes:
        p: class 3's budget as a fraction of the average per-layer budget (``0 < p <= 1``; ``1`` is uniform;
            default ``8 / 21``).
        n_clusters: KMeans clusters over the layers' similarities (an integer ``>= 2``; default 3).
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
        check_int("SqueezeAttentionRule", "n_clusters", self.n_clusters, 2)

    def layer_statistic(  # type: ignore[override]
        self, residual_in: torch.Tensor, attention_output: torch.Tensor
    ) -> SqueezeStatistic:
        """:func:`squeeze_layer_statistic` (the caller supplies the decoder layer's input, see there)."""
        return squeeze_layer_statistic(residual_in, attention_output)

    def token_statistic(self, residual_in: torch.Tensor, attention_output: torch.Tensor) -> torch.Tensor:
        """:func:`squeeze_token_similarities`: the per-token values :meth:`layer_statistic` averages.

        Args:
            residual_in: the decoder layer's input, ``(batch, tokens, hidden)``.
            attention_output: its attention output, ``(batch, tokens, hidden)``.
        """
        return squeeze_token_similarities(residual_in, attention_output)

    def statistic_from_tokens(self, parts: Sequence[torch.Tensor]) -> SqueezeStatistic:
        """:func:`squeeze_statistic_of_similarities`: the statistic from every part's :meth:`token_statistic`.

        Args:
            parts: per-token similarities of consecutive parts of the prompt, in order.
        """
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
        stats: Sequence[Sequence[float]],
        n_layers: int,
        prompt_tokens: int,
        total: int,
        window: int,
        floor: int,
    ) -> tuple[int, ...]:
        """SqueezeAttention's budgets: the :meth:`weights` shared out over ``total`` (see the module).

        Args:
            stats: one ``(similarity,)`` per layer.
            n_layers: number of layers.
            prompt_tokens: prompt length; also the per-layer cap.
            total: global number of kept tokens.
            window: the scorer's observation window, the smallest budget with ``floor``.
            floor: smallest budget per layer.

        Returns:
            ``n_layers`` integers summing to ``total``, in ``[layer_floor(...), prompt_tokens]``, never larger for
            a layer of higher similarity.

        Raises:
            ValueError: on invalid arguments or statistics.
        """
        check_rule_call(stats, n_layers, prompt_tokens, total, window, floor)
        if any(len(tuple(s)) != 1 for s in stats):
            raise ValueError("every SqueezeAttention statistic must be a 1-tuple (similarity,)")
        similarity = finite_array([tuple(s)[0] for s in stats], "SqueezeAttention similarities", nonnegative=False)
        weights = self.weights(similarity)
        if len(set(weights)) == 1:
            return even_split(total, n_layers)
        low = layer_floor(n_layers, prompt_tokens, total, window, floor)
        bounds = ([low] * n_layers, [prompt_tokens] * n_layers)
        return apportion([0] * n_layers, weights, total, *bounds, preference=[-s for s in similarity])
