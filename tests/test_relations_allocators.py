"""Relations the per-prompt allocators promise (issue 26): how heads and batch enter DynamicKV's counts, which KV
head a query head belongs to, and who wins a rounding tie. Each test names the seeded bug it was checked to catch
(``/tmp/relation_tests.tsv`` of issue 26 lists file and line).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.dynamickv import (
    DynamicKVRule,
    dynamickv_layer_statistic,
    dynamickv_pooled_scores,
)
from ripplekv.allocation.lava import LAVA_EPS, lava_layer_statistic
from ripplekv.allocation.per_prompt import apportion, top_k_counts
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule


def _brute_topk_counts(scores: list[np.ndarray], k: int) -> list[int]:
    """How many of the ``k`` best entries of all lists each list holds, by sorting tagged entries (no ties)."""
    tagged = sorted(((float(v), layer) for layer, s in enumerate(scores) for v in s), reverse=True)
    counts = [0] * len(scores)
    for _, layer in tagged[:k]:
        counts[layer] += 1
    return counts


def _window_attention(batch: int, heads: int, window: int, keys: int, seed: int) -> torch.Tensor:
    """Softmaxed rows of random logits (float64), sliced to the prefix keys as kvpress does."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(batch, heads, window, keys + window, generator=generator, dtype=torch.float64)
    return logits.softmax(dim=-1)[..., :keys]


# ------------------------------------------------------------------------- DynamicKV: heads and batch in the counts


def test_dynamickv_statistic_counts_batch_times_heads_rows() -> None:
    """``h`` of ``base * h * m`` is batch times heads: a batch of 2 prompts of 3 heads is 6 score rows.
    Seeded bug caught: ``heads = shape[1]`` (the batch left out)."""
    pooled = torch.rand(2, 3, 11, dtype=torch.float64)
    stat = dynamickv_layer_statistic(pooled)
    assert stat.heads == 6
    assert len(stat.scores) == 2 * 3 * 11


def test_dynamickv_counts_are_the_global_topk_of_base_times_heads_times_seen_layers() -> None:
    """At every update over ``m`` seen layers, the counts are brute force's top ``floor(spare * h * m / L)`` of those
    layers' entries, and each cap the minimum of ``floor(spare * c_l / sum c)`` over the earlier updates.
    Seeded bugs caught: ``h`` left out of ``k``; ``m`` replaced by ``L``; every layer counted at every update."""
    rng = np.random.default_rng(0)
    layers, heads, keys, spare = 6, 3, 20, 30
    strength = [4.0, 0.5, 2.0, 1.0, 3.0, 0.2]  # uneven layers, so every count matters
    scores = [np.sort(rng.random(heads * keys) * s)[::-1] for s in strength]
    stats = [(s, heads) for s in scores]
    rule = DynamicKVRule(update_interval=2)
    caps, counts = rule.progressive_caps(stats, layers, spare, budget_size=10**6)
    expected_caps = [10**6] * layers
    for seen in (2, 4):
        brute = _brute_topk_counts(scores[:seen], spare * heads * seen // layers)
        for layer in range(seen):
            expected_caps[layer] = min(expected_caps[layer], math.floor(spare * brute[layer] / sum(brute)))
    assert caps == tuple(expected_caps)
    assert counts == tuple(Fraction(c) for c in _brute_topk_counts(scores, spare * heads))


def test_dynamickv_budgets_of_a_batch_of_one_prompt_twice_equal_the_prompts_own() -> None:
    """A batch's rows are pooled with the heads: the same prompt twice (every score twice, ``h`` doubled) gets the
    budgets the prompt gets alone. Seeded bugs caught: ``h`` without the batch; ``h`` left out of ``k``."""
    rule = DynamicKVRule(kernel_size=3, update_interval=2)
    layers, window, keys = 5, 4, 28
    prompt = keys + window
    total = layers * 12
    single, double = [], []
    for layer in range(layers):
        attention = _window_attention(1, 2, window, keys, seed=layer) ** (1 + layer)  # layer-dependent spread
        single.append(rule.layer_statistic(attention))
        double.append(rule.layer_statistic(torch.cat([attention, attention])))
    assert {s.heads for s in double} == {4}
    alone = rule.layer_budgets(layers, prompt, 0, stats=single, total=total, window_size=window)
    assert len(set(alone)) > 2, "the prompts must give uneven budgets for the relation to say something"
    assert rule.layer_budgets(layers, prompt, 0, stats=double, total=total, window_size=window) == alone


def test_dynamickv_average_pool_is_the_zero_padded_window_mean_of_the_query_sums() -> None:
    """Brute force of ``S[h, j] = sum_{|d| <= k//2} (sum_i A[h, i, j + d]) / k``, zero outside the prefix.
    Seeded bugs caught: padding not counted (``count_include_pad=False``); a mean over the window queries."""
    attention = _window_attention(1, 2, 3, 9, seed=4)
    pooled = dynamickv_pooled_scores(attention, kernel_size=5, pooling="avgpool")
    summed = attention.sum(dim=2)[0].numpy()
    expected = np.zeros_like(summed)
    for h in range(2):
        for j in range(9):
            expected[h, j] = sum(summed[h, j + d] for d in range(-2, 3) if 0 <= j + d < 9) / 5
    np.testing.assert_allclose(pooled[0].numpy(), expected, rtol=0, atol=1e-14)


def test_dynamickv_tied_entries_share_the_last_slots_in_proportion() -> None:
    """Entries tied at the threshold share what is left in proportion to how many each list holds, so equal lists
    get equal counts whatever their order. Seeded bugs caught: ``>=`` for ``>`` (tied entries counted as above);
    the slots left given to the first list holding a tie."""
    tied = [np.array([5.0, 1.0, 1.0]), np.array([1.0, 1.0, 0.0]), np.array([1.0, 1.0, 0.0])]
    counts = top_k_counts(tied, 3)  # 5, then 2 slots among six tied 1's: 2/6 per tied entry
    assert counts == (1 + Fraction(2, 3), Fraction(2, 3), Fraction(2, 3))
    assert sum(counts) == 3
    assert top_k_counts(tied[::-1], 3) == counts[::-1]


# ------------------------------------------------------------------------ GQA: query head h reads KV head h // groups


def _lava_by_hand(attention: np.ndarray, values: np.ndarray, kernel: int, gqa: bool) -> float:
    """LAVa's normalised entropy, query head ``h`` weighted by the value norm of KV head ``h // (heads // kv)``."""
    _, heads, _, prefix = attention.shape
    kv_heads = values.shape[1]
    groups = heads // kv_heads
    mean = attention.mean(axis=2)[0]
    pad = kernel // 2
    padded = np.pad(mean, ((0, 0), (pad, pad)), constant_values=-np.inf)
    pooled = np.stack([padded[:, j : j + kernel].max(axis=1) for j in range(prefix)], axis=1)
    norms = np.abs(values[0, :, :prefix]).sum(axis=-1).max(axis=-1)  # per KV head
    scores = np.stack([pooled[h] * norms[h // groups] for h in range(heads)])
    if gqa:
        scores = np.stack([scores[g * groups : (g + 1) * groups].max(axis=0) for g in range(kv_heads)])
    flat = scores.reshape(-1)
    probs = flat / (flat.sum() + LAVA_EPS)
    return float(-(probs * np.log(probs + LAVA_EPS)).sum() / math.log(flat.size))


@pytest.mark.parametrize("gqa", [True, False], ids=["gqa", "per-query-head"])
def test_lava_weights_each_query_head_by_its_own_kv_heads_values(gqa: bool) -> None:
    """6 query heads over 2 KV heads (groups of 3), KV head 1's values 50 times larger: the entropy is brute
    force's with query head h scaled by KV head h // 3. Seeded bugs caught (in memory only: lava.py is another
    agent's file): ``h % kv_heads`` (``repeat`` for ``repeat_interleave``); a group max over interleaved heads."""
    attention = _window_attention(1, 6, 4, 10, seed=7) ** torch.arange(1, 7, dtype=torch.float64).view(1, 6, 1, 1)
    generator = torch.Generator().manual_seed(8)
    values = torch.randn(1, 2, 14, 5, generator=generator, dtype=torch.float64)
    values[:, 1] *= 50.0
    got = lava_layer_statistic(attention, values, kernel_size=3, pooling="maxpool", gqa_support=gqa).entropy
    want = _lava_by_hand(attention.numpy(), values.numpy(), 3, gqa)
    assert got == pytest.approx(want, rel=1e-12, abs=0)


# --------------------------------------------------------------------------- rounding ties: strength, preference


def test_apportion_breaks_a_remainder_tie_by_strength_then_preference_then_index() -> None:
    """Three equal remainders, two units left: higher strength first, then higher preference, then lower index.
    Seeded bugs caught: the preference ignored or reversed (``preference[i]`` for ``-preference[i]``); preference
    before strength in the sort key."""
    # shares 1/2 + t (additive level) summing to 2: t = 1/6, 2/3 each; the floors are 0, so two units are left
    offsets, slopes, total, lows, highs = [Fraction(1, 2)] * 3, [1, 1, 1], 2, [0] * 3, [5] * 3
    assert apportion(offsets, slopes, total, lows, highs) == (1, 1, 0)  # index order
    assert apportion(offsets, slopes, total, lows, highs, preference=[0.0, 1.0, 2.0]) == (0, 1, 1)
    assert apportion(offsets, slopes, total, lows, highs, preference=[2.0, 0.0, 1.0]) == (1, 0, 1)
    # strength decides before preference: the strongest entries win although their preference is lowest
    got = apportion(offsets, slopes, total, lows, highs, strength=[3, 2, 1], preference=[0.0, 1.0, 2.0])
    assert got == (1, 1, 0)


def test_cake_gives_a_rounding_tie_to_the_layer_of_larger_preference() -> None:
    """CAKE's shares ``w + P_l / sum(P) * spare`` of P = (1, 3), spare 2: 2.5 and 3.5, one unit left and equal
    remainders: it goes to the layer of larger P (CAKE's tie-breaker, ``apportion``'s ``strength``), which is the
    later one (index order would give (3, 3)). Seeded bugs caught: CAKE passing no tie-breaker; ``apportion``
    ignoring its ``strength`` (the slopes, all 1 here, always)."""
    rule = CakeRule()
    stats = [(1.0, 1.0), (3.0, 1.0)]
    assert rule.layer_budgets(2, 10, 0, stats=stats, total=6, window_size=2) == (2, 4)
    assert rule.layer_budgets(2, 10, 0, stats=stats[::-1], total=6, window_size=2) == (4, 2)


def test_squeezeattention_gives_a_rounding_tie_to_the_less_similar_layer() -> None:
    """Layers of one class share one weight; a unit left by rounding goes to the least similar of them first
    (``preference = -similarity``), so within a class budgets never increase with similarity, whatever the layers'
    order. Seeded bug caught: ``apportion`` dropping its ``preference`` (index order then favours layer 0)."""
    rule = SqueezeAttentionRule()
    similarity = [0.30, 0.10, 0.90, 0.20, 0.95]
    weights = rule.weights(similarity)
    classes = {w: [i for i in range(5) if weights[i] == w] for w in set(weights)}
    assert sorted(len(c) for c in classes.values()) == [2, 3]
    uneven = 0
    for total in range(40, 60):
        budgets = rule.layer_budgets(5, 100, 0, stats=[(s,) for s in similarity], total=total, window_size=0)
        for members in classes.values():
            ordered = [budgets[i] for i in sorted(members, key=lambda i: similarity[i])]
            assert ordered == sorted(ordered, reverse=True), (total, budgets)
            uneven += len(set(ordered)) > 1
    assert uneven > 5  # the ties occur
