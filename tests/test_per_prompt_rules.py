"""Per-prompt budget rules (issue 17): CAKE, SqueezeAttention, DynamicKV and LAVa.

Each method gets a hand-computed statistic (small tensors, the arithmetic written out in the comments), a
hand-computed budget rule, and property tests: budgets sum exactly to SnapKV's total, stay within
``[floor, prompt]``, are uniform (up to rounding) for equal statistics and monotone where the method promises it.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ripplekv.allocation.budget import BudgetSchedule, ProfileSchedule, allocate, scale_to_total
from ripplekv.allocation.cake import CakeRule, CakeStatistic, cake_layer_statistic, cake_preferences
from ripplekv.allocation.dynamickv import DynamicKVRule, dynamickv_layer_statistic, dynamickv_pooled_scores
from ripplekv.allocation.lava import LavaRule, lava_layer_statistic
from ripplekv.allocation.per_prompt import PerPromptSchedule, apportion, fill_shares, layer_floor, top_k_counts
from ripplekv.allocation.schedules import PyramidSchedule, UniformSchedule
from ripplekv.allocation.squeezeattention import (
    SqueezeAttentionRule,
    kmeans_1d,
    squeeze_groups,
    squeeze_layer_statistic,
)
from ripplekv_eval.running.budget_rows import row_budget

LN2 = math.log(2.0)

# Window attention of one layer: 1 prompt, 2 query heads, 2 window queries, 3 prefix keys. Rows are softmaxed
# over all keys (window keys included), so each sums to at most 1. Powers of two keep the logs exact.
WINDOW_ATTENTION = torch.tensor(
    [
        [
            [[0.5, 0.25, 0.125], [0.25, 0.25, 0.25]],  # head 0: queries 0 and 1
            [[0.5, 0.0, 0.0], [0.125, 0.5, 0.25]],  # head 1
        ]
    ],
    dtype=torch.float64,
)


# ----------------------------------------------------------------------------------------------------------- CAKE


def test_cake_statistic_by_hand() -> None:
    # H = -sum A log(A + 1e-10) over every entry. -a ln a: 0.5 -> 0.5 ln2, 0.25 -> 0.5 ln2, 0.125 -> 0.375 ln2.
    #   head 0: 0.5 + 0.5 + 0.375 + 0.5 + 0.5 + 0.5 = 2.875 ln2;  head 1: 0.5 + 0 + 0 + 0.375 + 0.5 + 0.5 = 1.875 ln2
    #   H = 4.75 ln2 = 3.2924491076597402, and the 1e-10 inside the log removes a * 1e-10 / a = 1e-10 per nonzero
    #   entry (10 of them; 0 * log(1e-10) = 0): H = 3.2924491076597402 - 1e-9.
    # V = sum over heads and keys of the unbiased variance over the 2 queries, (x - y)^2 / 2:
    #   head 0: (0.5-0.25)^2/2 + 0 + (0.125-0.25)^2/2 = 0.03125 + 0.0078125 = 0.0390625
    #   head 1: (0.5-0.125)^2/2 + (0-0.5)^2/2 + (0-0.25)^2/2 = 0.0703125 + 0.125 + 0.03125 = 0.2265625
    #   V = 0.265625 = 17/64
    dispersion, shift = cake_layer_statistic(WINDOW_ATTENTION)
    assert dispersion == pytest.approx(4.75 * LN2 - 10 * 1e-10, abs=1e-12)
    assert abs(dispersion - (3.2924491076597402 - 1e-9)) < 1e-12
    assert shift == pytest.approx(17 / 64, abs=1e-12)
    # P = H^(1/tau1) V^(1/tau2): tau = 1 -> H V = 0.874556...; tau1 = 2, tau2 = 0.5 -> sqrt(H) V^2
    (p1,) = cake_preferences([(dispersion, shift)])
    assert p1 == pytest.approx((4.75 * LN2 - 1e-9) * 17 / 64, abs=1e-12)
    (p2,) = cake_preferences([(dispersion, shift)], tau1=2.0, tau2=0.5)
    assert p2 == pytest.approx(math.sqrt(4.75 * LN2 - 1e-9) * (17 / 64) ** 2, abs=1e-12)


def test_cake_statistic_sums_over_the_batch_and_rejects_bad_input() -> None:
    doubled = cake_layer_statistic(torch.cat([WINDOW_ATTENTION, WINDOW_ATTENTION]))
    single = cake_layer_statistic(WINDOW_ATTENTION)
    assert doubled.dispersion == pytest.approx(2 * single.dispersion, abs=1e-12)
    assert doubled.shift == pytest.approx(2 * single.shift, abs=1e-12)
    with pytest.raises(ValueError, match="at least 2 queries"):
        cake_layer_statistic(WINDOW_ATTENTION[:, :, :1])
    with pytest.raises(ValueError, match="batch, heads, window, prefix_keys"):
        cake_layer_statistic(WINDOW_ATTENTION[0])
    with pytest.raises(ValueError, match="non-negative"):
        cake_layer_statistic(-WINDOW_ATTENTION)


def test_cake_budgets_by_hand() -> None:
    # P = H V = (1, 2, 6, 0); 4 layers, prompt 100, total 80, window 4: 64 tokens beyond the windows.
    # Shares 4 + 64 P / 9 = (100/9, 164/9, 420/9, 36/9) = (11.11, 18.22, 46.67, 4): floors (11, 18, 46, 4) = 79,
    # the last token to the largest remainder (layer 2, 0.67).
    stats = [(1, 1), (2, 1), (3, 2), (0, 5)]
    assert CakeRule().layer_budgets(4, 100, 0, stats=stats, total=80, window_size=4) == (11, 18, 47, 4)
    # Prompt 30: layer 2 is capped at 30 and its excess 420/9 - 30 = 150/9 is spread evenly (+50/9 each) over the
    # others: (150/9, 214/9, 30, 86/9) = (16.67, 23.78, 30, 9.56); floors (16, 23, 30, 9) = 78, +1 to layers 1
    # (0.78) and 0 (0.67).
    assert CakeRule().layer_budgets(4, 30, 0, stats=stats, total=80, window_size=4) == (17, 24, 30, 9)
    # Floor 10: layer 3 (4) and then layer 0 (11.11 - 2 < 10) are lifted to 10 and the deficit is taken evenly
    # from layers 1 and 2: 164/9 + s + 420/9 + s = 60, s = -22/9 -> (10, 142/9, 398/9, 10) = (10, 15.78, 44.22,
    # 10): floors 79, +1 to layer 1.
    assert CakeRule().layer_budgets(4, 100, 10, stats=stats, total=80, window_size=4) == (10, 16, 44, 10)
    # tau1 = 2: P = (1, sqrt 2, 2 sqrt 3, 0) -> shares 4 + 64 P / (1 + 1.41421 + 3.46410) = (14.888, 19.398, 41.714, 4)
    assert CakeRule(tau1=2.0).layer_budgets(4, 100, 0, stats=stats, total=80, window_size=4) == (15, 19, 42, 4)


def test_cake_rule_validation() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan, "1"):
        with pytest.raises(ValueError, match="tau1"):
            CakeRule(tau1=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tau2"):
        CakeRule(tau2=0)
    with pytest.raises(ValueError, match="one per layer"):
        CakeRule().layer_budgets(2, 10, 0, stats=[(1, 1)], total=10, window_size=0)
    with pytest.raises(ValueError, match="dispersions"):
        CakeRule().layer_budgets(2, 10, 0, stats=[(-1, 1), (1, 1)], total=10, window_size=0)
    with pytest.raises(ValueError, match="total"):
        CakeRule().layer_budgets(2, 10, 0, stats=[(1, 1), (1, 1)], total=21, window_size=0)


# ----------------------------------------------------------------------------------------------- SqueezeAttention


def test_squeeze_statistic_by_hand() -> None:
    # token 0: h = (1, 0), o = (0, 1), h + o = (1, 1): cos = 1 / sqrt 2 = 0.7071067811865476
    # token 1: h = (3, 4), o = (-3, 0), h + o = (0, 4): cos = 16 / (5 * 4) = 0.8
    # mean = (0.7071067811865476 + 0.8) / 2 = 0.7535533905932738
    residual = torch.tensor([[[1.0, 0.0], [3.0, 4.0]]], dtype=torch.float64)
    attention = torch.tensor([[[0.0, 1.0], [-3.0, 0.0]]], dtype=torch.float64)
    (similarity,) = squeeze_layer_statistic(residual, attention)
    assert abs(similarity - 0.7535533905932738) < 1e-12
    assert abs(similarity - (1 / math.sqrt(2) + 0.8) / 2) < 1e-12
    with pytest.raises(ValueError, match="batch, tokens, hidden"):
        squeeze_layer_statistic(residual, attention[:, :1])


def test_kmeans_by_hand() -> None:
    # sorted 0.5, 0.52, 0.7, 0.9, 0.95, 0.99: the split {0.5, 0.52}, {0.7}, {0.9, 0.95, 0.99} has sum of squares
    # 0.0002 + 0 + 0.0040667 = 0.0042667; the next best of the 10 splits into runs, {0.5}, {0.52, 0.7},
    # {0.9, 0.95, 0.99}, has 0 + 0.0162 + 0.0040667 = 0.0202667.
    labels, centres = kmeans_1d([0.9, 0.95, 0.5, 0.52, 0.99, 0.7])
    assert labels == (2, 2, 0, 0, 2, 1)
    assert centres == pytest.approx((0.51, 0.7, (0.9 + 0.95 + 0.99) / 3), abs=1e-12)
    # fewer distinct values than clusters: fewer clusters; one value: one cluster
    assert kmeans_1d([1.0, 2.0, 1.0]) == ((0, 1, 0), (1.0, 2.0))
    assert kmeans_1d([3.0, 3.0]) == ((0, 0), (3.0,))
    # repeated values cannot split a cluster: 1,1,1,1,1,1,2,3 -> {1...}, {2}, {3}
    assert kmeans_1d([1, 1, 1, 1, 1, 1, 2, 3])[0] == (0, 0, 0, 0, 0, 0, 1, 2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_kmeans_is_deterministic_order_free_and_contiguous(values: list[float], rng) -> None:
    first = kmeans_1d(values)
    assert kmeans_1d(list(values)) == first  # same input, same output
    order = list(range(len(values)))
    rng.shuffle(order)
    labels, centres = kmeans_1d([values[i] for i in order])
    assert centres == first[1]
    assert labels == tuple(first[0][i] for i in order)
    # 1-D clusters are runs of the sorted values: a larger value never has a lower label
    pairs = sorted(zip(values, first[0]))
    assert all(a[1] <= b[1] for a, b in zip(pairs, pairs[1:]))
    assert len(centres) == min(3, len(set(values)))


def test_squeeze_budgets_by_hand() -> None:
    sims = [(0.5,), (0.52,), (0.7,), (0.9,), (0.95,), (0.99,)]  # class 3: the last three (test_kmeans_by_hand)
    # The README's setting: ini_size 0.21, KV_class3 0.08, a prompt of 100 tokens, 6 layers (total 126).
    # Authors' code: class 3 keeps int(0.08 * 100) = 8; the others a = (6 * 0.21 - 3 * 0.08) / 3 = 0.34 -> 34.
    # Here p = 8/21: class 3 weight 8/21, others (6 - 3 * 8/21) / 3 = 34/21: shares 21 * w = 8 and 34, exactly.
    assert SqueezeAttentionRule().layer_budgets(6, 100, 0, stats=sims, total=126, window_size=0) == (
        34,
        34,
        34,
        8,
        8,
        8,
    )
    # p = 0.5, 20 per layer: class 3 10, the others (6 - 1.5) / 3 * 20 = 30
    assert SqueezeAttentionRule(p=0.5).layer_budgets(6, 100, 0, stats=sims, total=120, window_size=0) == (
        30,
        30,
        30,
        10,
        10,
        10,
    )
    # a window of 12 lifts class 3 to 12; the others share 120 - 36 = 84 -> 28 each
    assert SqueezeAttentionRule(p=0.5).layer_budgets(6, 100, 0, stats=sims, total=120, window_size=12) == (
        28,
        28,
        28,
        12,
        12,
        12,
    )
    # p = 1 is uniform, and so are equal similarities (a single cluster)
    assert SqueezeAttentionRule(p=1.0).layer_budgets(6, 100, 0, stats=sims, total=120, window_size=0) == (20,) * 6
    assert SqueezeAttentionRule().layer_budgets(6, 100, 0, stats=[(0.9,)] * 6, total=121, window_size=0) == (
        21,
        20,
        20,
        20,
        20,
        20,
    )
    assert squeeze_groups([0.5, 0.52, 0.7, 0.9, 0.95, 0.99]) == (False, False, False, True, True, True)


def test_squeeze_rule_validation() -> None:
    for bad in (0.0, 1.5, -0.1, math.nan):
        with pytest.raises(ValueError, match="p must"):
            SqueezeAttentionRule(p=bad)
    with pytest.raises(ValueError, match="n_clusters"):
        SqueezeAttentionRule(n_clusters=1)
    with pytest.raises(ValueError, match="1-tuple"):
        SqueezeAttentionRule().layer_budgets(1, 10, 0, stats=[(0.1, 0.2)], total=5, window_size=0)


# ------------------------------------------------------------------------------------------------------ DynamicKV


def test_dynamickv_statistic_by_hand() -> None:
    # summed over the 2 window queries: head 0 (0.75, 0.5, 0.375), head 1 (0.625, 0.5, 0.25).
    # average pool of width 3, zero padding counted (divide by 3 everywhere):
    #   head 0: (0 + 0.75 + 0.5)/3, (0.75 + 0.5 + 0.375)/3, (0.5 + 0.375 + 0)/3 = 1.25/3, 1.625/3, 0.875/3
    #   head 1: (0.625 + 0.5)/3, (0.625 + 0.5 + 0.25)/3, (0.5 + 0.25)/3 = 1.125/3, 1.375/3, 0.75/3
    pooled = dynamickv_pooled_scores(WINDOW_ATTENTION, kernel_size=3, pooling="avgpool")
    expected = torch.tensor([[[1.25, 1.625, 0.875], [1.125, 1.375, 0.75]]], dtype=torch.float64) / 3
    assert torch.allclose(pooled, expected, atol=1e-12, rtol=0)
    scores, heads = dynamickv_layer_statistic(pooled)
    assert heads == 2
    assert np.allclose(scores, np.array([1.625, 1.375, 1.25, 1.125, 0.875, 0.75]) / 3, atol=1e-12, rtol=0)
    # max pool of width 3 (padding never wins): head 0 (0.75, 0.75, 0.5), head 1 (0.625, 0.625, 0.5)
    maxed = dynamickv_pooled_scores(WINDOW_ATTENTION, kernel_size=3, pooling="maxpool")
    assert torch.equal(maxed, torch.tensor([[[0.75, 0.75, 0.5], [0.625, 0.625, 0.5]]], dtype=torch.float64))
    assert len(dynamickv_layer_statistic(pooled, keep=2).scores) == 2
    rule = DynamicKVRule(kernel_size=3)
    assert np.array_equal(rule.layer_statistic(WINDOW_ATTENTION).scores, scores)


def test_top_k_counts_share_ties() -> None:
    # top 4 of (3, 2, 2) and (2, 1): 3 and then three 2's tied for the last 3 slots -> 2 and 1 of them
    assert top_k_counts([np.array([3.0, 2.0, 2.0]), np.array([2.0, 1.0])], 4) == (3, 1)
    # top 2: 3, then one slot for three tied 2's: two thirds to layer 0, one third to layer 1
    assert top_k_counts([np.array([3.0, 2.0, 2.0]), np.array([2.0, 1.0])], 2) == (
        1 + Fraction(2, 3),
        Fraction(1, 3),
    )
    assert top_k_counts([np.array([1.0]), np.array([2.0])], 5) == (1, 1)


PROGRESSIVE = [
    (np.array([10.0] * 7 + [0.0] * 3), 1),  # layer 0: seven strong entries
    (np.array([5.0] * 4 + [0.0] * 6), 1),  # layer 1: four medium ones
    (np.array([1.0] * 10), 1),  # layer 2: weak, flat
]


def test_dynamickv_budgets_by_hand() -> None:
    # 3 layers, 1 head, prompt 10, window 0, total 12 (base 4 per layer); updates after 2 layers and at the end.
    # budget_size = min(int(10 * 4), 10 - 0) = 10.
    # Update 1 (layers 0-1): top 12 * 1 * 2 / 3 = 8 of 20 entries: the seven 10's and one 5 -> counts (7, 1);
    #   shares of the whole-model 12: floor(12 * 7/8) = 10, floor(12 * 1/8) = 1 -> layer 1 may keep 1 at most.
    # Update 2 (all): top 12 of 30: 10 x7, 5 x4, then one of the ten tied 1's (layer 2) -> counts (7, 4, 1).
    #   Shares 12 * (7, 4, 1) / 12 = (7, 4, 1), but layer 1 is capped at 1: the other 11 go to layers 0 and 2
    #   in the ratio 7 : 1 -> (9.625, 1, 1.375): floors (9, 1, 1) = 11, +1 to layer 0 (remainder 0.625).
    rule = DynamicKVRule(update_interval=2)
    assert rule.progressive_caps(PROGRESSIVE, 3, 12, 10) == ((10, 1, 10), (7, 4, 1))
    assert rule.layer_budgets(3, 10, 0, stats=PROGRESSIVE, total=12, window_size=0) == (10, 1, 1)
    # A single update at the end (interval >= 3): nothing carries over -> exactly the counts (7, 4, 1)
    assert DynamicKVRule(update_interval=3).layer_budgets(3, 10, 0, stats=PROGRESSIVE, total=12, window_size=0) == (
        7,
        4,
        1,
    )
    # A window of 1 (prompt 11, total 15): every layer keeps 1 + its share of the same 12 selected tokens
    assert rule.layer_budgets(3, 11, 0, stats=PROGRESSIVE, total=15, window_size=1) == (11, 2, 2)


def test_dynamickv_last_update_runs_at_the_last_layer() -> None:
    # 30 layers, interval 4: updates after 4, 8, ..., 28 layers and a last one over all 30 (the authors' code
    # never reallocates layers 28-29 of a 30-layer model)
    assert DynamicKVRule().update_steps(30) == (4, 8, 12, 16, 20, 24, 28, 30)
    assert DynamicKVRule().update_steps(32)[-1] == 32
    assert DynamicKVRule().update_steps(3) == (3,)


def test_dynamickv_keep_truncation_is_exact() -> None:
    rng = np.random.default_rng(0)
    full = [dynamickv_layer_statistic(torch.from_numpy(rng.random((1, 3, 50)))) for _ in range(6)]
    total, window = 6 * 12, 4  # 48 selected tokens in all: a layer counts at most 3 * 48 = 144 of its entries
    kept = [(s.scores[: 3 * (total - 6 * window)], s.heads) for s in full]
    rule = DynamicKVRule()
    assert rule.layer_budgets(6, 54, 0, stats=full, total=total, window_size=window) == rule.layer_budgets(
        6, 54, 0, stats=kept, total=total, window_size=window
    )


def test_dynamickv_rule_validation() -> None:
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        DynamicKVRule(kernel_size=4)
    with pytest.raises(ValueError, match="pooling"):
        DynamicKVRule(pooling="sum")
    with pytest.raises(ValueError, match="radio_max"):
        DynamicKVRule(radio_max=0.5)
    with pytest.raises(ValueError, match="update_interval"):
        DynamicKVRule(update_interval=0)
    with pytest.raises(ValueError, match="same number of heads"):
        DynamicKVRule().layer_budgets(2, 10, 0, stats=[(np.ones(3), 1), (np.ones(3), 2)], total=10, window_size=0)
    with pytest.raises(ValueError, match="another prompt length or window"):
        DynamicKVRule().layer_budgets(2, 10, 0, stats=[(np.ones(12), 1), (np.ones(3), 1)], total=10, window_size=0)
    # invalid statistics are an error at every total, also one that leaves nothing beyond the windows (an even
    # split, no statistic read) or a window that covers the prompt
    for total, window in ((4, 2), (10, 10)):
        with pytest.raises(ValueError, match="same number of heads"):
            DynamicKVRule().layer_budgets(
                2, 10, 0, stats=[(np.ones(3), 1), (np.ones(3), 2)], total=total, window_size=window
            )
        with pytest.raises(ValueError, match="finite"):
            DynamicKVRule().layer_budgets(
                2, 10, 0, stats=[(np.ones(3), 1), (np.array([np.nan]), 1)], total=total, window_size=window
            )
    # scores of another prompt length are refused when the total leaves nothing beyond the windows too
    with pytest.raises(ValueError, match="another prompt length or window"):
        DynamicKVRule().layer_budgets(2, 10, 0, stats=[(np.ones(12), 1), (np.ones(3), 1)], total=4, window_size=2)


# ----------------------------------------------------------------------------------------------------------- LAVa

# Values of the layer: 1 KV head (both query heads share it), the 3 prefix tokens then 2 window tokens, dim 2.
VALUES = torch.tensor([[[[1.0, -1.0], [0.5, 0.5], [-3.0, 1.0], [100.0, 100.0], [100.0, 100.0]]]], dtype=torch.float64)


def test_lava_statistic_by_hand() -> None:
    # mean over the 2 window queries: head 0 (0.375, 0.25, 0.1875), head 1 (0.3125, 0.25, 0.125)
    # max pool of width 3 (-inf padding): head 0 (0.375, 0.375, 0.25), head 1 (0.3125, 0.3125, 0.25)
    # value L1 norms of the prefix tokens: |1|+|-1| = 2, 0.5+0.5 = 1, 3+1 = 4 -> max 4 (window tokens ignored)
    # scores = pooled * 4: head 0 (1.5, 1.5, 1.0), head 1 (1.25, 1.25, 1.0)
    # gqa_support: max over the group's two query heads -> (1.5, 1.5, 1.0), N = 3, p = (0.375, 0.375, 0.25)
    #   E = -(2 * 0.375 ln 0.375 + 0.25 ln 0.25) = 0.7356219397587946 + 0.34657359027997264 = 1.0821955300387673
    #   e = E / ln 3 = 1.0821955300387673 / 1.0986122886681098 = 0.9850571...
    (entropy,) = lava_layer_statistic(WINDOW_ATTENTION, VALUES, kernel_size=3, pooling="maxpool")
    by_hand = -(2 * 0.375 * math.log(0.375) + 0.25 * math.log(0.25)) / math.log(3)
    assert abs(by_hand - 1.0821955300387673 / 1.0986122886681098) < 1e-15
    assert abs(entropy - by_hand) < 1e-12
    # without gqa_support: all 6 scores (1.5, 1.5, 1, 1.25, 1.25, 1) / 7.5 = (0.2, 0.2, 2/15, 1/6, 1/6, 2/15), N = 6
    (flat,) = lava_layer_statistic(WINDOW_ATTENTION, VALUES, kernel_size=3, pooling="maxpool", gqa_support=False)
    probs = [0.2, 0.2, 2 / 15, 1 / 6, 1 / 6, 2 / 15]
    assert abs(flat - (-sum(p * math.log(p) for p in probs) / math.log(6))) < 1e-12
    assert LavaRule(kernel_size=3).layer_statistic(WINDOW_ATTENTION, VALUES) == (entropy,)
    # The value norm only matters between KV heads (one norm per layer scales every entry alike, and the entropy
    # is scale-free). Two KV heads, one query head each (groups of 1): KV head 0 as above (max L1 norm 4; its L2
    # norm max would be sqrt 10), KV head 1 with prefix tokens (2, 0), (1, 1), (0, 1): L1 norms 2, 2, 1 -> max 2
    # (L2 max 2). Window tokens (100, 100) would give both heads 200.
    # scores: head 0 (0.375, 0.375, 0.25) * 4 = (1.5, 1.5, 1.0), head 1 (0.3125, 0.3125, 0.25) * 2 =
    # (0.625, 0.625, 0.5); sum 5.75, p = (6, 6, 4, 2.5, 2.5, 2) / 23, e = -sum p ln p / ln 6 = 0.9488445525...
    two = torch.cat([VALUES, torch.tensor([[[[2.0, 0.0], [1.0, 1.0], [0.0, 1.0], [100.0, 100.0], [100.0, 100.0]]]])], 1)
    (weighted,) = lava_layer_statistic(WINDOW_ATTENTION, two.to(torch.float64), kernel_size=3, pooling="maxpool")
    probs = [6 / 23, 6 / 23, 4 / 23, 2.5 / 23, 2.5 / 23, 2 / 23]
    assert abs(weighted - (-sum(p * math.log(p) for p in probs) / math.log(6))) < 1e-12
    assert abs(weighted - 0.9488445525003624) < 1e-12
    # one entry: no normalised entropy, defined as 0
    assert lava_layer_statistic(WINDOW_ATTENTION[:, :1, :, :1], VALUES[:, :, :1], kernel_size=1) == (0.0,)


def test_lava_budgets_by_hand() -> None:
    stats = [(0.5,), (1.0,), (0.25,), (0.25,)]
    # 4 layers, prompt 100, total 80, window 4: 64 beyond the windows, shares 4 + 64 e / 2 = (20, 36, 12, 12)
    assert LavaRule().layer_budgets(4, 100, 0, stats=stats, total=80, window_size=4) == (20, 36, 12, 12)
    # prompt 30: layer 1 capped at 30; the others 4 + t e with 12 + t = 50 -> t = 38: (23, 30, 13.5, 13.5);
    # floors 79, the last token to the tied remainders' lower layer (2)
    assert LavaRule().layer_budgets(4, 30, 0, stats=stats, total=80, window_size=4) == (23, 30, 14, 13)
    # all-zero entropies: uniform
    assert LavaRule().layer_budgets(4, 100, 0, stats=[(0.0,)] * 4, total=80, window_size=4) == (20, 20, 20, 20)


def test_lava_rule_validation() -> None:
    with pytest.raises(ValueError, match="pooling"):
        LavaRule(pooling="mean")
    with pytest.raises(ValueError, match="gqa_support"):
        LavaRule(gqa_support=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not match"):
        lava_layer_statistic(WINDOW_ATTENTION, VALUES[:, :, :2])
    with pytest.raises(ValueError, match="entropies"):
        LavaRule().layer_budgets(1, 10, 0, stats=[(math.nan,)], total=5, window_size=0)


# ------------------------------------------------------------------------------------------- common and properties


def test_schedule_spends_snapkvs_total() -> None:
    for budget, prompt in ((0.1, 100), (0.2, 284), (0.5, 1001), (64, 500), (1.0, 37)):
        spec = row_budget(budget).kwargs()
        uniform = sum(UniformSchedule(**spec).layer_budgets(30, prompt, 64))
        schedule = PerPromptSchedule(LavaRule(), **spec)
        assert schedule.total(30, prompt) == uniform
        budgets = schedule.layer_budgets(30, prompt, 64, stats=[(0.5 + layer / 100,) for layer in range(30)])
        assert sum(budgets) == uniform
    with pytest.raises(TypeError, match="PerPromptRule"):
        PerPromptSchedule(UniformSchedule(0.1), 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        PerPromptSchedule(LavaRule(), 1.5)
    with pytest.raises(ValueError, match="window_size"):
        PerPromptSchedule(LavaRule(), 0.1, window_size=-1)


def test_every_schedule_answers_one_budget_signature() -> None:
    """One budget contract (issue 45): every schedule, the per-prompt ones included, is a ``BudgetSchedule`` whose
    ``layer_budgets`` takes ``(n_layers, prompt_tokens, floor)`` in that order, a per-prompt one its statistics after
    them by keyword only; the rules and :func:`allocate` (one layer per score) take the same three first."""
    head = ["n_layers", "prompt_tokens", "floor"]
    offline = (UniformSchedule(0.5), PyramidSchedule(0.5, window_size=4), ProfileSchedule(0.5, (0.0, 1.0, 2.0)))
    rules = (CakeRule(), SqueezeAttentionRule(), DynamicKVRule(), LavaRule())
    per_prompt = tuple(PerPromptSchedule(rule, 0.5, window_size=4) for rule in rules)
    for owner in (*offline, *per_prompt, *rules):
        params = list(inspect.signature(owner.layer_budgets).parameters.values())
        assert [p.name for p in params[:3]] == head, owner
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[:3]), owner
        assert all(p.kind is p.KEYWORD_ONLY for p in params[3:]), owner
    for schedule in (*offline, *per_prompt):
        assert isinstance(schedule, BudgetSchedule)
    for schedule in per_prompt:
        assert [p for p in inspect.signature(schedule.layer_budgets).parameters][3:] == ["stats"]
    assert list(inspect.signature(allocate).parameters)[:3] == ["scores", "prompt_tokens", "floor"]
    stats = [(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)]
    cake = PerPromptSchedule(CakeRule(), 0.5, window_size=4)
    expected = CakeRule().layer_budgets(3, 100, 4, stats=stats, total=150, window_size=4)
    assert cake.layer_budgets(3, 100, 4, stats=stats) == expected and sum(expected) == 150
    with pytest.raises(TypeError):
        cake.layer_budgets(stats, 3, 100, 4)  # type: ignore[call-arg]
    assert PerPromptSchedule(CakeRule(), 0.1).statistic_names == ("dispersion", "shift")


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(0.01, 100), min_size=1, max_size=12),
    st.integers(0, 400),
    st.integers(0, 20),
    st.integers(1, 60),
)
def test_apportion_matches_scale_to_total(weights: list[float], total_seed: int, floor: int, cap: int) -> None:
    total = total_seed % (len(weights) * cap + 1)
    n = len(weights)
    low = min(floor, cap) if n * min(floor, cap) <= total else total // n
    ours = apportion([0] * n, weights, total, [low] * n, [cap] * n)
    assert list(ours) == scale_to_total(weights, total, floor, cap)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-5, 5), st.floats(0, 3), st.integers(0, 10), st.integers(0, 10)), min_size=1),
    st.integers(0, 200),
)
def test_fill_shares_hits_the_total_within_bounds(rows, total_seed: int) -> None:
    offsets = [r[0] for r in rows]
    slopes = [r[1] if r[1] > 0.5 else 0.0 for r in rows]  # some constant entries
    lows = [min(r[2], r[3]) for r in rows]
    highs = [max(r[2], r[3]) for r in rows]
    total = sum(lows) + total_seed % (sum(highs) - sum(lows) + 1)
    shares = fill_shares(offsets, slopes, lows, highs, total)
    assert sum(shares) == total
    assert all(lo <= x <= hi for x, lo, hi in zip(shares, lows, highs))


def _cake_stats(values: list[float], keys: int) -> list[tuple[float, float]]:
    return [(v, 1.0) for v in values]  # P = H with tau = 1 and V = 1


def _squeeze_stats(values: list[float], keys: int) -> list[tuple[float]]:
    return [(v,) for v in values]


def _lava_stats(values: list[float], keys: int) -> list[tuple[float]]:
    return [(v,) for v in values]


def _dynamickv_stats(values: list[float], keys: int) -> list[tuple[np.ndarray, int]]:
    # a layer of strength v: 2 heads x `keys` prefix keys of scores v * (1, 1/2, 1/3, ...)
    return [(v * np.repeat(1.0 / np.arange(1, keys + 1), 2), 2) for v in values]


RULES = [
    (CakeRule(), _cake_stats),
    (SqueezeAttentionRule(), _squeeze_stats),
    (DynamicKVRule(), _dynamickv_stats),
    (LavaRule(), _lava_stats),
]
CALLS = dict(
    values=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12),
    prompt=st.integers(1, 120),
    budget=st.one_of(st.floats(0.01, 1.0), st.integers(2, 150).map(float)),
    window=st.integers(0, 24),
    floor=st.integers(0, 30),
)


@pytest.mark.parametrize(("rule", "make"), RULES, ids=lambda r: getattr(r, "name", ""))
@settings(max_examples=60, deadline=None)
@given(**CALLS)
def test_budgets_sum_to_the_total_within_bounds(rule, make, values, prompt, budget, window, floor) -> None:
    n = len(values)
    schedule = PerPromptSchedule(rule, window_size=window, **row_budget(budget).kwargs())
    budgets = schedule.layer_budgets(n, prompt, floor, stats=make(values, max(1, prompt - window)))
    total = schedule.total(n, prompt)
    assert len(budgets) == n and all(isinstance(b, int) for b in budgets)
    assert sum(budgets) == total
    low = layer_floor(n, prompt, floor, total=total, window_size=window)
    assert all(low <= b <= prompt for b in budgets), (budgets, low, prompt)


@pytest.mark.parametrize(("rule", "make"), RULES, ids=lambda r: getattr(r, "name", ""))
@settings(max_examples=40, deadline=None)
@given(value=st.floats(0.0, 1.0), n=st.integers(1, 12), **{k: v for k, v in CALLS.items() if k != "values"})
def test_equal_statistics_give_uniform_budgets(rule, make, value, n, prompt, budget, window, floor) -> None:
    schedule = PerPromptSchedule(rule, window_size=window, **row_budget(budget).kwargs())
    budgets = schedule.layer_budgets(n, prompt, floor, stats=make([value] * n, max(1, prompt - window)))
    assert max(budgets) - min(budgets) <= 1


@pytest.mark.parametrize(
    ("rule", "make", "sign"),
    [(CakeRule(), _cake_stats, 1), (LavaRule(), _lava_stats, 1), (SqueezeAttentionRule(), _squeeze_stats, -1)],
    ids=["cake", "lava", "squeezeattention"],
)
@settings(max_examples=60, deadline=None)
@given(**CALLS)
def test_budgets_are_monotone_in_the_preference(rule, make, sign, values, prompt, budget, window, floor) -> None:
    # CAKE and LAVa: a larger preference never gets fewer tokens; SqueezeAttention: a larger similarity (a less
    # important layer) never gets more.
    n = len(values)
    schedule = PerPromptSchedule(rule, window_size=window, **row_budget(budget).kwargs())
    budgets = schedule.layer_budgets(n, prompt, floor, stats=make(values, max(1, prompt - window)))
    for i in range(n):
        for j in range(n):
            if values[i] > values[j]:
                assert sign * (budgets[i] - budgets[j]) >= 0, (values, budgets)


def test_rule_metadata_names_the_inputs() -> None:
    assert CakeRule.statistic_inputs == ("window_attention",)
    assert SqueezeAttentionRule.statistic_inputs == ("residual_in", "attention_output")
    assert DynamicKVRule.statistic_inputs == ("window_attention",)
    assert LavaRule.statistic_inputs == ("window_attention", "values")
    assert CakeStatistic._fields == CakeRule.statistic_names
    assert {r.name for r, _ in RULES} == {"cake", "squeezeattention", "dynamickv", "lava"}


@pytest.mark.slow
def test_statistics_from_a_real_prefill(smollm2: dict[str, Any]) -> None:
    """All four statistics from one SmolLM2-135M prefill (9 query heads, 3 KV heads), fed as a press would."""
    from kvpress import SnapKVPress
    from transformers import DynamicCache

    model, tokenizer = smollm2["model"], smollm2["tokenizer"]
    window = 16
    rules = [CakeRule(), SqueezeAttentionRule(), DynamicKVRule(), LavaRule()]
    stats: dict[str, list] = {rule.name: [] for rule in rules}
    residual: dict[int, torch.Tensor] = {}

    def layer_input(module, args, kwargs) -> None:  # the decoder layer's input: SqueezeAttention's h_in
        residual[module.self_attn.layer_idx] = args[0] if args else kwargs["hidden_states"]

    def attention_output(module, args, kwargs, output) -> None:
        cache = kwargs.get("past_key_values") or kwargs.get("past_key_value")
        keys, values = cache.layers[module.layer_idx].keys, cache.layers[module.layer_idx].values
        attention = SnapKVPress.compute_window_attention(
            module, kwargs["hidden_states"], keys, window, kwargs["position_embeddings"]
        )
        stats["cake"].append(rules[0].layer_statistic(attention))
        stats["squeezeattention"].append(rules[1].layer_statistic(residual[module.layer_idx], output[0]))
        stats["dynamickv"].append(rules[2].layer_statistic(attention))
        stats["lava"].append(rules[3].layer_statistic(attention, values))

    handles = []
    for layer in model.model.layers:
        handles.append(layer.register_forward_pre_hook(layer_input, with_kwargs=True))
        handles.append(layer.self_attn.register_forward_hook(attention_output, with_kwargs=True))
    text = " ".join(f"The key number {i} is {i * 37 % 101}." for i in range(12)) + " What is key number 7?"
    ids = tokenizer(text, return_tensors="pt").input_ids
    try:
        with torch.no_grad():
            model(ids, past_key_values=DynamicCache(), use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    n_layers, prompt = len(model.model.layers), ids.shape[1]
    assert stats["dynamickv"][0].heads == model.config.num_attention_heads
    assert all(0 < s.similarity <= 1 for s in stats["squeezeattention"])
    assert all(0 <= s.entropy <= 1 for s in stats["lava"])
    for rule in rules:
        schedule = PerPromptSchedule(rule, 0.3, window_size=window)
        budgets = schedule.layer_budgets(n_layers, prompt, window, stats=stats[rule.name])
        assert sum(budgets) == schedule.total(n_layers, prompt)
        assert all(window <= b <= prompt for b in budgets)


# ------------------------------------------------------------------------- boundaries, defaults and frozen rules


def test_dynamickv_pooled_scores_default_kernel_and_shape_checks() -> None:
    # the defaults: an average pool of width 7 (pad 3 each side, padding counted). With 3 keys every window
    # covers all of them: head 0 (0.75 + 0.5 + 0.375) / 7 = 1.625 / 7 at each key, head 1 1.375 / 7
    expected = torch.tensor([[[1.625] * 3, [1.375] * 3]], dtype=torch.float64) / 7
    assert torch.allclose(dynamickv_pooled_scores(WINDOW_ATTENTION), expected, atol=1e-15, rtol=0)
    # width 5 (pad 2): again every window covers the 3 keys -> 1.625 / 5 and 1.375 / 5
    assert torch.allclose(
        dynamickv_pooled_scores(WINDOW_ATTENTION, kernel_size=5), expected * 7 / 5, atol=1e-15, rtol=0
    )
    # a single prefix key is enough: head 0 sums 0.5 + 0.25 = 0.75, head 1 0.5 + 0.125 = 0.625, over 3
    one = dynamickv_pooled_scores(WINDOW_ATTENTION[..., :1], kernel_size=3)
    assert torch.allclose(one, torch.tensor([[[0.75], [0.625]]], dtype=torch.float64) / 3, atol=1e-15, rtol=0)
    with pytest.raises(ValueError, match="at least one prefix key"):
        dynamickv_pooled_scores(WINDOW_ATTENTION[..., :0], kernel_size=3)
    with pytest.raises(ValueError, match="at least one prefix key"):
        dynamickv_pooled_scores(WINDOW_ATTENTION[0], kernel_size=3)  # 3-D


def test_dynamickv_keep_of_one_and_single_entry_counts() -> None:
    pooled = dynamickv_pooled_scores(WINDOW_ATTENTION, kernel_size=3)
    (best,), heads = dynamickv_layer_statistic(pooled, keep=1)  # keep >= 1: the highest score alone
    assert best == pytest.approx(1.625 / 3, abs=1e-15) and heads == 2
    with pytest.raises(ValueError, match="keep"):
        dynamickv_layer_statistic(pooled, keep=0)
    # one entry in all: the top 1 is it; k == all entries: every list's whole size
    assert top_k_counts([np.array([2.0]), np.array([])], 1) == (1, 0)
    assert top_k_counts([np.array([]), np.array([2.0])], 3) == (0, 1)
    assert top_k_counts([np.array([3.0, 1.0]), np.array([1.0])], 3) == (2, 1)


def test_dynamickv_rejects_statistics_longer_than_the_prefix() -> None:
    # window 2 of a 10-token prompt: 8 prefix keys, so one head has at most 8 scores
    stats = [(np.ones(8), 1), (np.arange(8.0), 1)]
    assert sum(DynamicKVRule().layer_budgets(2, 10, 0, stats=stats, total=10, window_size=2)) == 10
    with pytest.raises(ValueError, match="another prompt length or window"):
        DynamicKVRule().layer_budgets(2, 10, 0, stats=[(np.ones(9), 1), (np.ones(8), 1)], total=10, window_size=2)


@pytest.mark.parametrize(
    "rule", [CakeRule(), SqueezeAttentionRule(), DynamicKVRule(), LavaRule()], ids=lambda r: r.name
)
def test_rules_are_frozen(rule: Any) -> None:
    field = next(iter(dataclasses.fields(rule))).name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(rule, field, getattr(rule, field))


def test_lava_rejects_non_finite_or_negative_input() -> None:
    nan = WINDOW_ATTENTION.clone()
    nan[0, 1, 0, 2] = math.nan
    negative = WINDOW_ATTENTION.clone()
    negative[0, 0, 1, 1] = -0.25
    infinite = VALUES.clone()
    infinite[0, 0, 2, 1] = math.inf  # a prefix token's value
    for attention, values in ((nan, VALUES), (negative, VALUES), (WINDOW_ATTENTION, infinite)):
        with pytest.raises(ValueError, match="finite"):
            lava_layer_statistic(attention, values, kernel_size=3)
    window_only = VALUES.clone()
    window_only[0, 0, 4, 0] = math.inf  # a window token's value is never read
    assert lava_layer_statistic(WINDOW_ATTENTION, window_only, kernel_size=3) == lava_layer_statistic(
        WINDOW_ATTENTION, VALUES, kernel_size=3
    )


def test_lava_normaliser_adds_the_eps() -> None:
    # the scores of test_lava_statistic_by_hand scaled by 1e-17: (1.5, 1.5, 1.0) * 1e-17, summing to 4e-17.
    # p = S / (sum S + 1e-16) = (1.5, 1.5, 1.0) / 14 (summing to 2/7, not 1), E = -sum p ln(p + 1e-16)
    (entropy,) = lava_layer_statistic(WINDOW_ATTENTION * 1e-17, VALUES, kernel_size=3)
    probs = [1.5 / 14, 1.5 / 14, 1.0 / 14]
    assert abs(entropy - (-sum(p * math.log(p + 1e-16) for p in probs) / math.log(3))) < 1e-12


def test_lava_total_below_the_windows_splits_evenly() -> None:
    # 2 layers of window 4 at a total of 7 < 2 * 4: nothing is left to share by e, the even split (4, 3)
    # (water-filling w + t * e down to the total would give the higher e the fewer tokens: (3, 4))
    assert LavaRule().layer_budgets(2, 10, 0, stats=[(1.0,), (0.5,)], total=7, window_size=4) == (4, 3)
    assert LavaRule().layer_budgets(2, 10, 0, stats=[(1.0,), (0.5,)], total=8, window_size=4) == (
        4,
        4,
    )  # exactly the windows


def _slow_chain(m: int) -> np.ndarray:
    """0, ``m`` increasing values, 1: 2-cluster Lloyd from the sorted start moves one value to the lower cluster per
    step (about ``m / 2`` steps), each chain value 1e-9 below the midpoint of the two centres of the state where the
    lower cluster is 0 and the chain's first ``j`` values (a fixed point, found by iterating)."""
    chain = np.linspace(0.3, 0.6, m)
    lower = np.arange(m)
    for _ in range(300):
        before = np.concatenate([[0.0], np.cumsum(chain)[:-1]])  # sum of chain[:j]
        chain = (before / (1 + lower) + (chain.sum() - before + 1.0) / (1 + m - lower)) / 2 - 1e-9
    return np.concatenate([[0.0], chain, [1.0]])


def test_kmeans_of_a_slow_lloyd_chain_is_the_least_squares_split() -> None:
    # Lloyd from the sorted start needed about 105 steps on this chain (the old MAX_LLOYD_ITERATIONS = 100 cut it
    # short); the exact split is the best of the 211 cuts of the sorted values, however slow Lloyd would be.
    values = _slow_chain(210)
    assert np.all(np.diff(values) > 0)
    exact = [Fraction(v) for v in values.tolist()]

    def sse(run: list[Fraction]) -> Fraction:
        mean = sum(run, Fraction(0)) / len(run)
        return sum(((x - mean) ** 2 for x in run), Fraction(0))

    costs = [sse(exact[:cut]) + sse(exact[cut:]) for cut in range(1, len(exact))]
    labels, _ = kmeans_1d(values.tolist(), 2)
    cut = labels.index(1)
    assert labels == (0,) * cut + (1,) * (len(exact) - cut)
    assert costs[cut - 1] == min(costs)
    assert costs.count(min(costs)) == 1


@pytest.mark.parametrize(("rule", "make"), RULES, ids=lambda r: getattr(r, "name", ""))
@settings(max_examples=60, deadline=None)
@given(bad=st.integers(0, 11), **CALLS)
def test_a_nan_statistic_is_an_error_at_every_total(rule, make, bad, values, prompt, budget, window, floor) -> None:
    """Every rule refuses a non-finite statistic, also at a total that leaves nothing beyond the windows (where the
    budgets are an even split that reads no statistic)."""
    n = len(values)
    values = [math.nan if i == bad % n else v for i, v in enumerate(values)]
    schedule = PerPromptSchedule(rule, window_size=window, **row_budget(budget).kwargs())
    with pytest.raises(ValueError):
        schedule.layer_budgets(n, prompt, floor, stats=make(values, max(1, prompt - window)))
