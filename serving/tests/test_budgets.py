"""Group budgets: the library's per-layer RippleKV budgets at each prompt's own length, in blocks, at SnapKV-uniform's
total; tiers of equal sizes; fixed fractions as the hole arithmetic; per-layer and pooled kept blocks."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PROFILE
from ripplekv.allocation import AllocationConfig, allocate
from ripplekv.profiling.profile import SensitivityProfile

from ripplekv_vllm.budgets import FractionBudgets, ProfileBudgets, apportion, layer_groups, tier_groups
from ripplekv_vllm.hole import hole, min_kept_blocks

BS, WINDOW = 32, 64
LENGTHS = (64, 100, 333, 1000, 1024, 2237, 3142, 4095)


@pytest.fixture(scope="module")
def scores() -> tuple[float, ...]:
    """The library's SmolLM2-135M profile scores (benchmarks/results/smollm2-135m.profile.json)."""
    return SensitivityProfile.load(PROFILE).scores


def per_layer(scores, budget: float, ratio: float = 4.0, gamma: float = 3.0) -> ProfileBudgets:
    return ProfileBudgets(layer_groups(len(scores)), scores, budget, ratio, gamma, BS, WINDOW)


@pytest.mark.parametrize("budget", [0.1, 0.2, 0.3])
@pytest.mark.parametrize("n", LENGTHS)
def test_per_layer_groups_keep_snapkv_uniforms_blocks(scores, budget: float, n: int) -> None:
    budgets = per_layer(scores, budget)
    uniform = hole(n, budget, BS, WINDOW)[0] // BS
    assert sum(budgets.kept_blocks(n)) == len(scores) * uniform


@pytest.mark.parametrize("budget", [0.1, 0.2, 0.3])
@pytest.mark.parametrize("n", LENGTHS)
def test_each_layer_keeps_its_library_budget_up_to_a_block(scores, budget: float, n: int) -> None:
    budgets = per_layer(scores, budget)
    library = allocate(scores, n, WINDOW, budget=budget, config=AllocationConfig(4.0, 3.0)).budgets
    assert budgets.library_budgets(n) == library  # what LayerBudgetPress keeps with SnapKV's window
    served = budgets.layer_budgets(n)
    low = min(min_kept_blocks(n, BS, WINDOW), n // BS) * BS + n % BS
    shift = sum(served) - sum(library)  # SnapKV-uniform's own rounding, spread over the layers
    for layer, (mine, theirs) in enumerate(zip(served, library)):
        assert mine >= low and mine <= n
        if mine > low and mine < n // BS * BS + n % BS:  # not held at a bound
            assert abs(mine - theirs) < BS + abs(shift) / len(served) + 1, (layer, mine, theirs)


@pytest.mark.parametrize("n", LENGTHS)
def test_a_more_sensitive_layer_never_keeps_fewer_blocks(scores, n: int) -> None:
    kept = per_layer(scores, 0.2).kept_blocks(n)
    for i in range(len(scores)):
        for j in range(len(scores)):
            if scores[i] < scores[j]:
                assert kept[i] <= kept[j], (n, i, j)


@pytest.mark.parametrize("tiers", [1, 2, 3, 5, 6, 10, 15, 30])
def test_tiers_partition_the_layers_in_equal_sizes(tiers: int) -> None:
    order = list(reversed(range(30)))
    groups = tier_groups(order, tiers)
    assert sorted(layer for g in groups for layer in g) == list(range(30))
    assert {len(g) for g in groups} == {30 // tiers}
    with pytest.raises(ValueError, match="dividing the 30 layers"):
        tier_groups(order, 4)


def test_tiers_keep_snapkv_uniforms_blocks_too(scores) -> None:
    groups = tier_groups(sorted(range(30), key=lambda i: scores[i]), 3)
    budgets = ProfileBudgets(groups, scores, 0.2, 4.0, 3.0, BS, WINDOW)
    for n in LENGTHS:
        assert sum(budgets.kept_blocks(n)) * 10 == 30 * (hole(n, 0.2, BS, WINDOW)[0] // BS)


def test_fraction_budgets_are_the_hole_arithmetic() -> None:
    budgets = FractionBudgets.of_layers([0.25, 0.25, 0.5, 0.5], BS, WINDOW)
    assert budgets.groups == ((0, 1), (2, 3))
    for n in LENGTHS:
        assert budgets.hole(n, 0) == hole(n, 0.25, BS, WINDOW)
        assert budgets.hole(n, 1) == hole(n, 0.5, BS, WINDOW)
    uneven = FractionBudgets.of_layers([0.25, 0.5, 0.5], BS, WINDOW)  # one KV-cache group serves any grouping
    assert uneven.groups == ((0,), (1, 2))
    assert (
        uneven.layer_kept_blocks(1000)
        == (hole(1000, 0.25, BS, WINDOW)[0] // BS,) + (hole(1000, 0.5, BS, WINDOW)[0] // BS,) * 2
    )


def test_apportion_is_largest_remainder_within_bounds() -> None:
    pref = np.zeros(3)
    assert apportion(np.array([1.2, 1.5, 1.9]), 5, 0, 10, pref) == (1, 2, 2)  # 1+1+1, then .9 and .5 get one each
    assert apportion(np.array([1.2, 1.5, 1.9]), 3, 0, 10, pref) == (1, 1, 1)
    assert apportion(np.array([0.2, 5.0, 5.0]), 6, 1, 4, pref) == (1, 2, 3)  # clipped to [1, 4], then 3 removed
    assert apportion(np.array([2.5, 2.5]), 5, 0, 5, np.array([0.0, 1.0])) == (2, 3)  # a tie goes to the preferred
    with pytest.raises(ValueError, match="cannot apportion"):
        apportion(np.array([1.0, 1.0]), 9, 0, 4, np.zeros(2))
