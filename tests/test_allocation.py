"""Tests of the RippleKV per-layer budget allocation (ripplekv.allocation)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ripplekv.allocation import (
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    Allocation,
    AllocationConfig,
    allocate,
    allocate_budgets,
    layer_weights,
    normalize_scores,
    resolve_average_budget,
    scale_to_total,
)

PROPERTY = settings(max_examples=300, deadline=None)

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
# Plain random scores, and scores drawn from a small pool so that repeated values (ties) are common.
score_lists = st.one_of(
    st.lists(finite_floats, min_size=1, max_size=64),
    st.lists(st.floats(-10, 10), min_size=1, max_size=4).flatmap(
        lambda pool: st.lists(st.sampled_from(pool), min_size=1, max_size=64)
    ),
)
budgets = st.one_of(
    st.floats(min_value=0.0, max_value=1.0, exclude_min=True),  # a kept fraction of the prompt
    st.integers(min_value=2, max_value=20_000),  # an average token count
    st.integers(min_value=2, max_value=20_000).map(float),  # ... given as an integer-valued float
)
prompt_lengths = st.integers(min_value=1, max_value=10_000)
configs = st.builds(AllocationConfig, ratio=st.floats(1.0, 20.0), gamma=st.floats(1.0, 10.0))
min_token_counts = st.integers(min_value=0, max_value=128)


def effective_floor(n_layers: int, average: int, prompt_tokens: int, min_tokens: int) -> int:
    """The documented floor: min(min_tokens, prompt_tokens), lowered to B // L when L * floor > B."""
    floor = min(min_tokens, prompt_tokens)
    total = n_layers * average
    return total // n_layers if n_layers * floor > total else floor


def reference_shares(weights: np.ndarray, total: int, low: int, high: int) -> np.ndarray:
    """Real shares clip(t * w, low, high) with sum == total, with t found by bisection (independent of the code)."""
    lo, hi = 0.0, high / float(weights.min()) * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if np.clip(mid * weights, low, high).sum() < total:
            lo = mid
        else:
            hi = mid
    return np.clip(hi * weights, low, high)


# ----------------------------------------------------------------------------------------- property tests


@PROPERTY
@given(score_lists, budgets, prompt_lengths, configs, min_token_counts)
def test_sum_and_bounds(scores, budget, prompt_tokens, config, min_tokens):
    result = allocate_budgets(scores, budget, prompt_tokens, config, min_tokens)
    average = resolve_average_budget(budget, prompt_tokens)
    floor = effective_floor(len(scores), average, prompt_tokens, min_tokens)
    assert len(result) == len(scores)
    assert all(isinstance(b, int) for b in result)
    assert sum(result) == len(scores) * average
    assert all(floor <= b <= prompt_tokens for b in result), (result, floor, prompt_tokens)


@PROPERTY
@given(score_lists, budgets, prompt_lengths, configs, min_token_counts)
def test_monotone_in_score(scores, budget, prompt_tokens, config, min_tokens):
    result = allocate_budgets(scores, budget, prompt_tokens, config, min_tokens)
    for i, (s_i, b_i) in enumerate(zip(scores, result, strict=True)):
        for s_j, b_j in zip(scores[:i], result[:i], strict=True):
            if s_i > s_j:
                assert b_i >= b_j, (scores, result)
            elif s_i < s_j:
                assert b_i <= b_j, (scores, result)
            else:
                assert abs(b_i - b_j) <= 1, (scores, result)


@PROPERTY
@given(score_lists, budgets, prompt_lengths, configs, min_token_counts)
def test_proportional_to_weights_with_water_filling(scores, budget, prompt_tokens, config, min_tokens):
    """Each budget is its real share clip(t * w_l, floor, cap), rounded down or up."""
    result = np.array(allocate_budgets(scores, budget, prompt_tokens, config, min_tokens))
    average = resolve_average_budget(budget, prompt_tokens)
    floor = effective_floor(len(scores), average, prompt_tokens, min_tokens)
    shares = reference_shares(layer_weights(scores, config), len(scores) * average, floor, prompt_tokens)
    assert np.all(np.abs(result - shares) < 1 + 1e-6 * prompt_tokens), (result, shares)


@PROPERTY
@given(
    st.integers(1, 64),
    finite_floats,
    score_lists,
    budgets,
    prompt_lengths,
    configs,
    min_token_counts,
    st.sampled_from(["equal", "ratio", "gamma"]),
)
def test_uniform_cases(n_layers, value, scores, budget, prompt_tokens, config, min_tokens, case):
    if case == "equal":
        scores = [value] * n_layers
    elif case == "ratio":
        config = AllocationConfig(ratio=1.0, gamma=config.gamma)
    else:
        config = AllocationConfig(ratio=config.ratio, gamma=1.0)
    average = resolve_average_budget(budget, prompt_tokens)
    assert allocate_budgets(scores, budget, prompt_tokens, config, min_tokens) == [average] * len(scores)


@PROPERTY
@given(
    score_lists,
    budgets,
    prompt_lengths,
    st.floats(0.05, 20.0),
    st.floats(1.0, 10.0),
    min_token_counts,
)
def test_gamma_bounds_the_disparity(scores, budget, prompt_tokens, ratio, gamma, min_tokens):
    config = AllocationConfig(ratio=ratio, gamma=gamma)
    result = allocate_budgets(scores, budget, prompt_tokens, config, min_tokens)
    average = resolve_average_budget(budget, prompt_tokens)
    floor = effective_floor(len(scores), average, prompt_tokens, min_tokens)
    if all(floor < b < prompt_tokens for b in result) and min(result) > 0:
        disparity = (max(result) - 1) / (min(result) + 1)
        assert disparity <= gamma**2 + 1e-9, (result, gamma)
        if ratio >= 1:  # the weights lie in [1, min(ratio, gamma)]
            assert disparity <= min(ratio, gamma) + 1e-9, (result, ratio, gamma)


@PROPERTY
@given(score_lists, finite_floats, st.floats(0.05, 20.0), st.floats(1.0, 10.0))
def test_weights_follow_the_rule(scores, _unused, ratio, gamma):
    config = AllocationConfig(ratio=ratio, gamma=gamma)
    normalized = normalize_scores(scores)
    weights = layer_weights(scores, config)
    assert normalized.dtype == np.float64 and weights.dtype == np.float64
    assert np.all((normalized >= 0) & (normalized <= 1))
    if len(set(scores)) > 1:
        assert normalized.min() == 0 and normalized.max() == 1
    else:
        assert np.all(normalized == 0)
    expected = np.clip(ratio**normalized, 1 / gamma, gamma)
    np.testing.assert_allclose(weights, expected, rtol=1e-12)
    assert np.all((weights >= 1 / gamma) & (weights <= gamma))


@PROPERTY
@given(score_lists, budgets, prompt_lengths, configs, min_token_counts)
def test_deterministic_and_consistent(scores, budget, prompt_tokens, config, min_tokens):
    first = allocate_budgets(scores, budget, prompt_tokens, config, min_tokens)
    assert allocate_budgets(list(scores), budget, prompt_tokens, config, min_tokens) == first
    assert allocate_budgets(np.array(scores), budget, prompt_tokens, config, min_tokens) == first
    full = allocate(tuple(scores), budget, prompt_tokens, config, min_tokens)
    assert list(full.budgets) == first
    assert full.total == sum(first) == len(scores) * full.average_budget
    assert full.weights == tuple(layer_weights(scores, config).tolist())


@PROPERTY
@given(
    st.lists(st.integers(-1000, 1000), min_size=1, max_size=64),
    st.sampled_from([0.25, 0.5, 2.0, 4.0]),
    st.integers(-64, 64),
    budgets,
    prompt_lengths,
    configs,
    min_token_counts,
)
def test_invariant_to_affine_rescaling(scores, scale, shift, budget, prompt_tokens, config, min_tokens):
    """Min-max normalisation makes the allocation independent of the scores' unit and offset."""
    moved = [scale * s + shift for s in scores]  # exact in float64 for these values
    assert allocate_budgets(moved, budget, prompt_tokens, config, min_tokens) == allocate_budgets(
        scores, budget, prompt_tokens, config, min_tokens
    )


@PROPERTY
@given(budgets, prompt_lengths)
def test_resolve_average_budget_range(budget, prompt_tokens):
    average = resolve_average_budget(budget, prompt_tokens)
    assert isinstance(average, int)
    assert 1 <= average <= prompt_tokens
    if budget <= 1:
        assert average == max(1, int(prompt_tokens * (1 - (1 - budget))))  # kvpress's compute_n_kept
    else:
        assert average == min(int(budget), prompt_tokens)


# -------------------------------------------------------------------------------------------- plain cases


def test_hand_computed_example():
    config = AllocationConfig(ratio=4.0, gamma=10.0)
    np.testing.assert_array_equal(layer_weights([0.0, 1.0], config), [1.0, 4.0])
    # B = 2 * int(100 * 0.5) = 100, shares 100 * [1, 4] / 5 = [20, 80].
    assert allocate_budgets([0.0, 1.0], 0.5, 100, config) == [20, 80]


def test_cap_redistributes_the_excess():
    # weights [1, 2, 4]; B = 3 * 60 = 180; shares 180 / 7 * [1, 2, 4] = [25.7, 51.4, 102.9]: layer 2 is capped
    # at 100 and the other 80 tokens are shared 1 : 2 = [26.67, 53.33] -> floors [26, 53] + 1 leftover token to
    # the larger remainder (layer 0).
    config = AllocationConfig(ratio=4.0, gamma=10.0)
    assert allocate_budgets([0.0, 0.5, 1.0], 0.6, 100, config) == [27, 53, 100]
    # Two layers: shares [32, 128] -> [60, 100].
    assert allocate_budgets([0.0, 1.0], 0.8, 100, config) == [60, 100]


def test_floor_redistributes_the_deficit():
    # weights [1, 10]; B = 20; shares [1.8, 18.2]; the floor of 5 lifts layer 0, layer 1 gets the rest.
    config = AllocationConfig(ratio=10.0, gamma=10.0)
    assert allocate_budgets([0.0, 1.0], 10, 1000, config, min_tokens=5) == [5, 15]
    assert allocate_budgets([0.0, 1.0], 10, 1000, config, min_tokens=0) == [2, 18]
    # A floor above the average (50 > 10) cannot hold for every layer: it is lowered to B // L = 10.
    assert allocate_budgets([0.0, 1.0], 10, 1000, config, min_tokens=50) == [10, 10]


def test_rounding_tie_breaks():
    # weights [1, 1, 2], B = 6: shares [1.5, 1.5, 3]; equal weights -> lower layer index gets the token.
    assert allocate_budgets([0.0, 0.0, 1.0], 2, 100, AllocationConfig(ratio=2.0, gamma=10.0)) == [2, 1, 3]
    # weights [1, 3], B = 2: shares [0.5, 1.5]; equal remainders -> the larger weight gets the token.
    config = AllocationConfig(ratio=3.0, gamma=10.0)
    assert allocate_budgets([0.0, 1.0], 0.1, 10, config, min_tokens=0) == [0, 2]
    assert allocate_budgets([1.0, 0.0], 0.1, 10, config, min_tokens=0) == [2, 0]
    # weights clipped to the same value 2 (ratio 16, gamma 2): the higher score wins the tie, not the index.
    clipped = AllocationConfig(ratio=16.0, gamma=2.0)
    np.testing.assert_array_equal(layer_weights([0.0, 0.9, 0.8, 1.0], clipped)[1:], [2.0, 2.0, 2.0])
    result = allocate_budgets([0.0, 0.9, 0.8, 1.0], 0.1, 100, clipped)
    assert sum(result) == 4 * 9 and result[3] >= result[1] >= result[2]  # 10% of 100 is 9 (kvpress rounding)


def test_weights_clip_and_inverse_ratio():
    np.testing.assert_allclose(layer_weights([0, 1, 2], AllocationConfig(4.0, 10.0)), [1, 2, 4])
    np.testing.assert_allclose(layer_weights([0, 1, 2], AllocationConfig(16.0, 2.0)), [1, 2, 2])
    np.testing.assert_allclose(layer_weights([0, 1, 2], AllocationConfig(0.25, 2.0)), [1, 0.5, 0.5])
    assert allocate_budgets([0.0, 1.0], 0.5, 100, AllocationConfig(0.25, 10.0)) == [80, 20]


def test_normalize_extreme_scores():
    np.testing.assert_array_equal(normalize_scores([-1e308, 0.0, 1e308]), [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(normalize_scores([3.5, 3.5]), [0.0, 0.0])
    np.testing.assert_array_equal(normalize_scores([2.0, 4.0, 3.0]), [0.0, 1.0, 0.5])


def test_resolve_average_budget_examples():
    assert resolve_average_budget(0.1, 1000) == 99  # int(1000 * (1 - 0.9)), as kvpress keeps
    assert resolve_average_budget(0.5, 1000) == 500
    assert resolve_average_budget(0.1, 100) == 9  # as kvpress: int(100 * (1 - 0.9)) == 9
    assert resolve_average_budget(0.001, 10) == 1  # never below one token
    assert resolve_average_budget(1, 37) == 37  # 1 is the fraction 100%
    assert resolve_average_budget(1.0, 37) == 37
    assert resolve_average_budget(2, 1000) == 2
    assert resolve_average_budget(512, 1000) == 512
    assert resolve_average_budget(512.0, 1000) == 512
    assert resolve_average_budget(np.float64(512.0), 100) == 100  # capped at the prompt
    assert resolve_average_budget(np.int64(512), 100) == 100


@pytest.mark.parametrize("budget", [0, 0.0, -1, -0.5, 1.5, 512.5, math.nan, math.inf, -math.inf, "0.5", None, True])
def test_invalid_budget(budget):
    with pytest.raises(ValueError, match="budget"):
        resolve_average_budget(budget, 100)
    with pytest.raises(ValueError, match="budget"):
        allocate_budgets([0.0, 1.0], budget, 100)


def test_nan_budget_message():
    with pytest.raises(ValueError, match="NaN"):
        resolve_average_budget(math.nan, 100)


@pytest.mark.parametrize("prompt_tokens", [0, -3, 1.5, 10.0, True, None])
def test_invalid_prompt_tokens(prompt_tokens):
    with pytest.raises(ValueError, match="prompt_tokens"):
        resolve_average_budget(0.5, prompt_tokens)


@pytest.mark.parametrize("min_tokens", [-1, 1.5, None, True])
def test_invalid_min_tokens(min_tokens):
    with pytest.raises(ValueError, match="min_tokens"):
        allocate_budgets([0.0, 1.0], 0.5, 100, min_tokens=min_tokens)


@pytest.mark.parametrize("ratio", [0, 0.0, -1.0, math.nan, math.inf, "4", True])
def test_invalid_ratio(ratio):
    with pytest.raises(ValueError, match="ratio"):
        AllocationConfig(ratio=ratio)


@pytest.mark.parametrize("gamma", [0.5, 0.0, -2.0, 0.999, math.nan, math.inf, "3", True])
def test_invalid_gamma(gamma):
    with pytest.raises(ValueError, match="gamma"):
        AllocationConfig(gamma=gamma)


def test_nan_score():
    with pytest.raises(ValueError, match=r"layer 2 is NaN"):
        allocate_budgets([0.0, 1.0, math.nan, 2.0], 0.5, 100)
    with pytest.raises(ValueError, match="NaN"):
        layer_weights([math.nan], AllocationConfig())


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_infinite_score(bad):
    with pytest.raises(ValueError, match=r"layer 1 .*non-finite"):
        allocate_budgets([0.0, bad], 0.5, 100)


@pytest.mark.parametrize("scores", [[], (), np.array([]), np.zeros((2, 2)), ["a", "b"]])
def test_malformed_scores(scores):
    with pytest.raises(ValueError, match="scores"):
        allocate_budgets(scores, 0.5, 100)
    with pytest.raises(ValueError, match="scores"):
        layer_weights(scores, AllocationConfig())


def test_defaults_and_allocation_record():
    assert AllocationConfig() == AllocationConfig(ratio=DEFAULT_RATIO, gamma=DEFAULT_GAMMA)
    assert DEFAULT_RATIO > 0 and DEFAULT_GAMMA >= 1
    with pytest.raises(AttributeError):
        AllocationConfig().ratio = 2.0  # type: ignore[misc]
    result = allocate([0.0, 2.0, 1.0], 0.1, 1000, AllocationConfig(ratio=4.0, gamma=10.0))
    assert isinstance(result, Allocation)
    assert result.scores == (0.0, 2.0, 1.0)
    assert result.normalized == (0.0, 1.0, 0.5)
    assert result.weights == (1.0, 4.0, 2.0)
    # 10% of 1000 is 99 in kvpress's arithmetic; 297 * [1, 4, 2] / 7 = [42.4, 169.7, 84.9]
    assert result.budgets == (42, 170, 85)
    assert (result.prompt_tokens, result.average_budget, result.total) == (1000, 99, 297)
    as_dict = result.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["budgets"] == [42, 170, 85]
    assert set(as_dict) == {
        "scores",
        "normalized",
        "weights",
        "budgets",
        "prompt_tokens",
        "average_budget",
        "total",
    }


def test_single_layer_gets_the_average():
    assert allocate_budgets([7.0], 0.25, 999) == [249]
    assert allocate_budgets([7.0], 4096, 999) == [999]


# ----------------------------------------------------------------------------------------- scale_to_total


@PROPERTY
@given(
    st.lists(st.floats(0.01, 1000.0), min_size=1, max_size=64),
    st.integers(0, 10_000),
    st.integers(0, 200),
    st.data(),
)
def test_scale_to_total_sum_bounds_and_order(weights, cap, floor, data):
    total = data.draw(st.integers(0, len(weights) * cap))
    result = scale_to_total(weights, total, floor, cap)
    low = min(floor, cap)
    low = total // len(weights) if len(weights) * low > total else low
    assert sum(result) == total and all(low <= b <= cap for b in result)
    for i in range(len(weights)):
        for j in range(len(weights)):
            if weights[i] > weights[j]:
                assert result[i] >= result[j], (weights, result)
    shares = reference_shares(np.array(weights), total, low, cap)
    assert np.all(np.abs(np.array(result) - shares) < 1 + 1e-6 * max(cap, 1)), (result, shares)


def test_scale_to_total_examples_and_errors():
    assert scale_to_total([3, 2, 1], 60, 0, 100) == [30, 20, 10]
    assert scale_to_total([1, 1, 1], 10, 0, 100) == [4, 3, 3]  # leftover to the lower index
    assert scale_to_total([1, 1, 1], 10, 0, 100, preference=[0, 0, 1]) == [3, 3, 4]
    assert scale_to_total([100, 1, 1], 30, 5, 18) == [18, 6, 6]  # cap binds, the excess goes to the others
    assert scale_to_total([1, 1], 3, 5, 10) == [2, 1]  # a floor above the average is lowered to it
    with pytest.raises(ValueError, match="at least one weight"):
        scale_to_total([], 0, 0, 1)
    with pytest.raises(ValueError, match="positive"):
        scale_to_total([1.0, 0.0], 4, 0, 10)
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match="finite"):
            scale_to_total([1.0, bad], 4, 0, 10)
    with pytest.raises(ValueError, match="does not fit"):
        scale_to_total([1.0, 1.0], 21, 0, 10)
    for name, args in (("total", (-1, 0, 10)), ("floor", (4, 1.5, 10)), ("cap", (4, 0, None))):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= 0"):
            scale_to_total([1.0, 1.0], *args)
