"""Tests of the RippleKV per-layer budget allocation (ripplekv.allocation)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpress.utils import compute_n_kept

from ripplekv.allocation.budget import (
    DEFAULT_CONFIG,
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    Allocation,
    AllocationConfig,
    BudgetSpec,
    TokenBudgetError,
    allocate,
    compression_ratio_keeping,
    layer_weights,
    normalize_scores,
    scale_to_total,
)
from ripplekv.allocation.schedules import UniformSchedule
from ripplekv_eval.running.budget_rows import budget_value, row_budget, row_value

PROPERTY = settings(max_examples=300, deadline=None)

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
# Plain random scores, and scores drawn from a small pool so that repeated values (ties) are common.
score_lists = st.one_of(
    st.lists(finite_floats, min_size=1, max_size=64),
    st.lists(st.floats(-10, 10), min_size=1, max_size=4).flatmap(
        lambda pool: st.lists(st.sampled_from(pool), min_size=1, max_size=64)
    ),
)
# A budget as keyword arguments: a kept fraction (budget=) or an average token count per layer (tokens=).
budgets = st.one_of(
    st.floats(min_value=0.0, max_value=1.0, exclude_min=True).map(lambda b: {"budget": b}),
    st.integers(min_value=1, max_value=20_000).map(lambda t: {"tokens": t}),
    st.integers(min_value=1, max_value=20_000).map(lambda t: {"tokens": np.int64(t)}),  # a NumPy integer
)
prompt_lengths = st.integers(min_value=1, max_value=10_000)
configs = st.builds(AllocationConfig, ratio=st.floats(1.0, 20.0), gamma=st.floats(1.0, 10.0))
min_token_counts = st.integers(min_value=0, max_value=128)


def alloc(scores, budget, prompt_tokens, config=DEFAULT_CONFIG, min_tokens=1):
    """``allocate(...).budgets`` with a drawn budget (``{"budget": f}`` or ``{"tokens": n}``)."""
    return list(allocate(scores, prompt_tokens, min_tokens, config=config, **budget).budgets)


def average_of(budget, prompt_tokens):
    """The average of a drawn budget."""
    return BudgetSpec(**budget).average(prompt_tokens)


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
    result = alloc(scores, budget, prompt_tokens, config, min_tokens)
    average = average_of(budget, prompt_tokens)
    floor = effective_floor(len(scores), average, prompt_tokens, min_tokens)
    assert len(result) == len(scores)
    assert all(isinstance(b, int) for b in result)
    assert sum(result) == len(scores) * average
    assert all(floor <= b <= prompt_tokens for b in result), (result, floor, prompt_tokens)


@PROPERTY
@given(score_lists, budgets, prompt_lengths, configs, min_token_counts)
def test_monotone_in_score(scores, budget, prompt_tokens, config, min_tokens):
    result = alloc(scores, budget, prompt_tokens, config, min_tokens)
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
    result = np.array(alloc(scores, budget, prompt_tokens, config, min_tokens))
    average = average_of(budget, prompt_tokens)
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
    average = average_of(budget, prompt_tokens)
    assert alloc(scores, budget, prompt_tokens, config, min_tokens) == [average] * len(scores)


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
    result = alloc(scores, budget, prompt_tokens, config, min_tokens)
    average = average_of(budget, prompt_tokens)
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
    first = alloc(scores, budget, prompt_tokens, config, min_tokens)
    assert alloc(list(scores), budget, prompt_tokens, config, min_tokens) == first
    assert alloc(np.array(scores), budget, prompt_tokens, config, min_tokens) == first
    full = allocate(tuple(scores), prompt_tokens, min_tokens, config=config, **budget)
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
    assert alloc(moved, budget, prompt_tokens, config, min_tokens) == alloc(
        scores, budget, prompt_tokens, config, min_tokens
    )


@PROPERTY
@given(budgets, prompt_lengths)
def test_budget_average_range(budget, prompt_tokens):
    average = average_of(budget, prompt_tokens)
    assert isinstance(average, int)
    assert 1 <= average <= prompt_tokens
    if "budget" in budget:
        fraction = budget["budget"]
        assert average == max(1, int(prompt_tokens * (1 - (1 - fraction))))  # kvpress's compute_n_kept
    else:
        assert average == min(int(budget["tokens"]), prompt_tokens)
    # compression_ratio_for is defined for both kinds, in [0, 1), and kvpress keeps exactly the average with it
    ratio = BudgetSpec(**budget).compression_ratio_for(prompt_tokens)
    assert 0 <= ratio < 1 and not math.isnan(ratio)
    assert compute_n_kept(prompt_tokens, ratio) == average


# -------------------------------------------------------------------------------------------- plain cases


def test_hand_computed_example():
    config = AllocationConfig(ratio=4.0, gamma=10.0)
    np.testing.assert_array_equal(layer_weights([0.0, 1.0], config), [1.0, 4.0])
    # B = 2 * int(100 * 0.5) = 100, shares 100 * [1, 4] / 5 = [20, 80].
    assert list(allocate([0.0, 1.0], 100, budget=0.5, config=config).budgets) == [20, 80]


def test_cap_redistributes_the_excess():
    # weights [1, 2, 4]; B = 3 * 60 = 180; shares 180 / 7 * [1, 2, 4] = [25.7, 51.4, 102.9]: layer 2 is capped
    # at 100 and the other 80 tokens are shared 1 : 2 = [26.67, 53.33] -> floors [26, 53] + 1 leftover token to
    # the larger remainder (layer 0).
    config = AllocationConfig(ratio=4.0, gamma=10.0)
    assert list(allocate([0.0, 0.5, 1.0], 100, budget=0.6, config=config).budgets) == [27, 53, 100]
    # Two layers: shares [32, 128] -> [60, 100].
    assert list(allocate([0.0, 1.0], 100, budget=0.8, config=config).budgets) == [60, 100]


def test_floor_redistributes_the_deficit():
    # weights [1, 10]; B = 20; shares [1.8, 18.2]; the floor of 5 lifts layer 0, layer 1 gets the rest.
    config = AllocationConfig(ratio=10.0, gamma=10.0)
    assert list(allocate([0.0, 1.0], 1000, 5, tokens=10, config=config).budgets) == [5, 15]
    assert list(allocate([0.0, 1.0], 1000, 0, tokens=10, config=config).budgets) == [2, 18]
    # A floor above the average (50 > 10) cannot hold for every layer: it is lowered to B // L = 10.
    assert list(allocate([0.0, 1.0], 1000, 50, tokens=10, config=config).budgets) == [10, 10]


def test_rounding_tie_breaks():
    # weights [1, 1, 2], B = 6: shares [1.5, 1.5, 3]; equal weights -> lower layer index gets the token.
    assert list(allocate([0.0, 0.0, 1.0], 100, tokens=2, config=AllocationConfig(2.0, 10.0)).budgets) == [
        2,
        1,
        3,
    ]
    # weights [1, 3], B = 2: shares [0.5, 1.5]; equal remainders -> the larger weight gets the token.
    config = AllocationConfig(ratio=3.0, gamma=10.0)
    assert list(allocate([0.0, 1.0], 10, 0, budget=0.1, config=config).budgets) == [0, 2]
    assert list(allocate([1.0, 0.0], 10, 0, budget=0.1, config=config).budgets) == [2, 0]
    # weights clipped to the same value 2 (ratio 16, gamma 2): the higher score wins the tie, not the index.
    clipped = AllocationConfig(ratio=16.0, gamma=2.0)
    np.testing.assert_array_equal(layer_weights([0.0, 0.9, 0.8, 1.0], clipped)[1:], [2.0, 2.0, 2.0])
    result = list(allocate([0.0, 0.9, 0.8, 1.0], 100, budget=0.1, config=clipped).budgets)
    assert sum(result) == 4 * 9 and result[3] >= result[1] >= result[2]  # 10% of 100 is 9 (kvpress rounding)


def test_weights_clip_and_inverse_ratio():
    np.testing.assert_allclose(layer_weights([0, 1, 2], AllocationConfig(4.0, 10.0)), [1, 2, 4])
    np.testing.assert_allclose(layer_weights([0, 1, 2], AllocationConfig(16.0, 2.0)), [1, 2, 2])
    np.testing.assert_allclose(layer_weights([0, 1, 2], AllocationConfig(0.25, 2.0)), [1, 0.5, 0.5])
    assert list(allocate([0.0, 1.0], 100, budget=0.5, config=AllocationConfig(0.25, 10.0)).budgets) == [80, 20]


def test_normalize_extreme_scores():
    np.testing.assert_array_equal(normalize_scores([-1e308, 0.0, 1e308]), [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(normalize_scores([3.5, 3.5]), [0.0, 0.0])
    np.testing.assert_array_equal(normalize_scores([2.0, 4.0, 3.0]), [0.0, 1.0, 0.5])


def test_budget_average_examples():
    assert BudgetSpec(0.1).average(1000) == 99  # int(1000 * (1 - 0.9)), as kvpress keeps
    assert BudgetSpec(0.5).average(1000) == 500
    assert BudgetSpec(0.1).average(100) == 9  # as kvpress: int(100 * (1 - 0.9)) == 9
    assert BudgetSpec(0.001).average(10) == 1  # never below one token
    assert BudgetSpec(1).average(37) == 37  # 1 is the fraction 100%
    assert BudgetSpec(1.0).average(37) == 37
    assert BudgetSpec(tokens=1).average(37) == 1  # one token per layer: never read as 100%
    assert BudgetSpec(tokens=2).average(1000) == 2
    assert BudgetSpec(None, 512).average(1000) == 512
    assert BudgetSpec(tokens=512).average(100) == 100  # capped at the prompt
    assert BudgetSpec(tokens=np.int64(512)).average(100) == 100


@pytest.mark.parametrize("budget", [0, 0.0, -1, -0.5, 1.5, 512.5, math.nan, math.inf, -math.inf, "0.5", True])
def test_invalid_budget(budget):
    with pytest.raises(ValueError, match="budget"):
        BudgetSpec(budget).average(100)
    with pytest.raises(ValueError, match="budget"):
        list(allocate([0.0, 1.0], 100, budget=budget).budgets)


@pytest.mark.parametrize("budget", [2, 512, 512.0, 1.0000001, np.float64(512.0)])
def test_budget_above_one_points_to_tokens(budget):
    """A value above 1 is never read as a token count: the error says to use tokens=."""
    with pytest.raises(ValueError, match=r"above 1.*tokens="):
        BudgetSpec(budget).average(1000)
    with pytest.raises(ValueError, match=r"above 1.*tokens="):
        allocate([0.0, 1.0], 1000, budget=budget)


def test_budget_and_tokens_exactly_one():
    with pytest.raises(ValueError, match="not both"):
        list(allocate([0.0, 1.0], 100, budget=0.5, tokens=10).budgets)
    with pytest.raises(ValueError, match="no budget given"):
        list(allocate([0.0, 1.0], 100).budgets)
    with pytest.raises(ValueError, match="no budget given"):
        BudgetSpec(None).average(100)


# ------------------------------------------------------------------------------- BudgetSpec, at each boundary

BOUNDARY_ERRORS = [
    # (kwargs, what the message must say)
    ({"budget": 0}, r"budget must be > 0"),
    ({"budget": 0.0}, r"budget must be > 0"),
    ({"budget": -0.1}, r"budget must be > 0"),
    ({"budget": 1.0000001}, r"above 1.*tokens=N"),
    ({"budget": 2}, r"above 1.*tokens=2"),
    ({"budget": math.nan}, r"budget is NaN"),
    ({"budget": math.inf}, r"budget is inf \(infinite\)"),
    ({"budget": -math.inf}, r"budget is -inf \(infinite\)"),
    ({"budget": True}, r"budget must be a real number"),
    ({"budget": np.bool_(True)}, r"budget must be a real number"),
    ({"budget": "0.5"}, r"budget must be a real number"),
    ({"tokens": 0}, r"tokens must be >= 1"),
    ({"tokens": -5}, r"tokens must be >= 1"),
    ({"tokens": True}, r"tokens must be an integer >= 1 .*got a bool"),
    ({"tokens": False}, r"tokens must be an integer >= 1 .*got a bool"),
    ({"tokens": 512.0}, r"tokens must be an integer"),
    ({"tokens": 1.5}, r"tokens must be an integer"),
    ({"tokens": math.nan}, r"tokens must be an integer"),
    ({"tokens": math.inf}, r"tokens must be an integer"),
    ({"budget": 0.5, "tokens": 10}, r"not both"),
    ({}, r"no budget given"),
]


@pytest.mark.parametrize(("kwargs", "message"), BOUNDARY_ERRORS, ids=[str(k) for k, _ in BOUNDARY_ERRORS])
def test_budget_spec_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BudgetSpec(**kwargs)
    with pytest.raises(ValueError, match=f"^UniformSchedule: .*{message}"):
        UniformSchedule(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"budget": 1}, BudgetSpec(budget=1.0)),  # the upper bound is a fraction: keep everything
        ({"budget": 1.0}, BudgetSpec(budget=1.0)),
        ({"budget": 5e-324}, BudgetSpec(budget=5e-324)),  # the smallest float above 0
        ({"budget": np.float32(0.5)}, BudgetSpec(budget=0.5)),
        ({"tokens": 1}, BudgetSpec(tokens=1)),  # the lower bound of a token count
        ({"tokens": np.int64(7)}, BudgetSpec(tokens=7)),
    ],
)
def test_budget_spec_accepts_the_bounds(kwargs, expected):
    spec = BudgetSpec(**kwargs)
    assert spec == expected
    assert type(spec.budget if spec.budget is not None else spec.tokens) in (float, int)


def test_fraction_one_and_one_token_differ():
    """The confusion this API removes: 1.0 keeps every token, tokens=1 keeps one per layer."""
    assert BudgetSpec(budget=1.0).average(500) == 500
    assert BudgetSpec(tokens=1).average(500) == 1
    assert BudgetSpec(budget=1.0) != BudgetSpec(tokens=1)


def test_compression_ratio_of_each_kind():
    assert BudgetSpec(budget=0.1).compression_ratio == pytest.approx(0.9)
    assert BudgetSpec(budget=1.0).compression_ratio == 0.0
    with pytest.raises(TokenBudgetError, match=r"compression_ratio_for\(prompt_tokens\)"):
        _ = BudgetSpec(tokens=512).compression_ratio
    assert isinstance(TokenBudgetError("x"), ValueError)  # not an AttributeError: getattr(...) does not hide it
    assert BudgetSpec(tokens=512).compression_ratio_for(2048) == 0.75
    assert BudgetSpec(tokens=512).compression_ratio_for(100) == 0.0  # every token kept
    assert BudgetSpec(budget=0.5).compression_ratio_for(1000) == 0.5
    # 10% of 100 tokens keeps 9 (kvpress's rounding), so 91% is removed, and kvpress keeps 9 at that ratio
    ratio = BudgetSpec(budget=0.1).compression_ratio_for(100)
    assert ratio == pytest.approx(0.91) and compute_n_kept(100, ratio) == 9
    with pytest.raises(ValueError, match="prompt_tokens"):
        BudgetSpec(tokens=5).compression_ratio_for(0)


@PROPERTY
@given(st.integers(1, 100_000).flatmap(lambda n: st.tuples(st.integers(1, n), st.just(n))))
def test_compression_ratio_keeping_round_trips_through_kvpress(pair):
    kept, total = pair
    ratio = compression_ratio_keeping(kept, total)
    assert 0 <= ratio < 1
    assert ratio == pytest.approx(1 - kept / total, abs=1e-12)
    assert compute_n_kept(total, ratio) == kept


@pytest.mark.parametrize(("kept", "total"), [(0, 10), (11, 10), (1, 0), (1.0, 10), (True, 10)])
def test_compression_ratio_keeping_refuses(kept, total):
    with pytest.raises(ValueError):
        compression_ratio_keeping(kept, total)


def test_budget_values_of_rows():
    """The numeric row column: a fraction <= 1 as a float, a token count > 1 as an int; tokens=1 has none."""
    assert row_value(BudgetSpec(budget=0.1)) == 0.1 and type(row_value(BudgetSpec(budget=1))) is float
    assert row_value(BudgetSpec(tokens=512)) == 512 and type(row_value(BudgetSpec(tokens=512))) is int
    with pytest.raises(ValueError, match="tokens=1 has no numeric budget value"):
        _ = row_value(BudgetSpec(tokens=1))
    assert row_budget(1.0) == BudgetSpec(budget=1.0)
    assert row_budget(0.3) == BudgetSpec(budget=0.3)
    assert row_budget(512) == row_budget(512.0) == BudgetSpec(tokens=512)
    assert row_budget(2) == BudgetSpec(tokens=2)
    for bad in (0, -1, 1.5, math.nan, math.inf, True, "2"):
        with pytest.raises(ValueError):
            row_budget(bad)
    assert budget_value(512.0) == 512 and type(budget_value(512.0)) is int
    assert type(budget_value(0.2)) is float
    assert BudgetSpec(tokens=512).kwargs() == {"tokens": 512} and BudgetSpec(budget=0.2).kwargs() == {"budget": 0.2}


def test_nan_budget_message():
    with pytest.raises(ValueError, match="NaN"):
        BudgetSpec(math.nan).average(100)


@pytest.mark.parametrize("prompt_tokens", [0, -3, 1.5, 10.0, True, None])
def test_invalid_prompt_tokens(prompt_tokens):
    with pytest.raises(ValueError, match="prompt_tokens"):
        BudgetSpec(0.5).average(prompt_tokens)


@pytest.mark.parametrize("floor", [-1, 1.5, None, True])
def test_invalid_floor(floor):
    with pytest.raises(ValueError, match="floor must be an integer"):
        list(allocate([0.0, 1.0], 100, floor, budget=0.5).budgets)


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
        list(allocate([0.0, 1.0, math.nan, 2.0], 100, budget=0.5).budgets)
    with pytest.raises(ValueError, match="NaN"):
        layer_weights([math.nan], AllocationConfig())


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_infinite_score(bad):
    with pytest.raises(ValueError, match=r"layer 1 .*non-finite"):
        list(allocate([0.0, bad], 100, budget=0.5).budgets)


@pytest.mark.parametrize("scores", [[], (), np.array([]), np.zeros((2, 2)), ["a", "b"]])
def test_malformed_scores(scores):
    with pytest.raises(ValueError, match="scores"):
        list(allocate(scores, 100, budget=0.5).budgets)
    with pytest.raises(ValueError, match="scores"):
        layer_weights(scores, AllocationConfig())


def test_defaults_and_allocation_record():
    assert AllocationConfig() == AllocationConfig(ratio=DEFAULT_RATIO, gamma=DEFAULT_GAMMA)
    assert DEFAULT_RATIO > 0 and DEFAULT_GAMMA >= 1
    with pytest.raises(AttributeError):
        AllocationConfig().ratio = 2.0  # type: ignore[misc]
    result = allocate([0.0, 2.0, 1.0], 1000, budget=0.1, config=AllocationConfig(ratio=4.0, gamma=10.0))
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
    assert list(allocate([7.0], 999, budget=0.25).budgets) == [249]
    assert list(allocate([7.0], 999, tokens=4096).budgets) == [999]


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


@pytest.mark.parametrize(
    ("module", "name", "replacement"),
    [
        ("ripplekv.allocation", "kept_ratio", "compression_ratio_keeping"),
        ("ripplekv.allocation", "check_budget", "BudgetSpec(budget, tokens)"),
        ("ripplekv.allocation", "resolve_average_budget", "BudgetSpec(budget, tokens).average(prompt_tokens)"),
        ("ripplekv.allocation", "allocate_budgets", "allocate(scores, ...).budgets"),
        ("ripplekv", "allocate_budgets", "ripplekv.allocate(scores, ...).budgets"),
    ],
)
def test_removed_names_point_to_their_replacement(module, name, replacement):
    with pytest.raises(ImportError, match=re.escape(f"use {replacement}")):
        exec(f"from {module} import {name}", {})
