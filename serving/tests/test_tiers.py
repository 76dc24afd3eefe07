"""Tiers from a RippleKV profile: the library's global budget, the profile's order, equal tier sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROFILE
from ripplekv.allocation import AllocationConfig, allocate

from ripplekv_vllm.tiers import group_into_tiers, library_budgets, load_profile, tier_keep_fractions


@pytest.fixture(scope="module")
def profile():
    """The library's SmolLM2-135M profile (benchmarks/results/smollm2-135m.profile.json)."""
    return load_profile(PROFILE)


@pytest.mark.parametrize(("budget", "tiers", "reference"), [(0.1, 3, 4096), (0.2, 5, 2048), (0.3, 2, 1102)])
def test_tiers_spend_the_library_budget(profile, budget: float, tiers: int, reference: int) -> None:
    fractions = tier_keep_fractions(profile, budget, tiers, reference, window=64)
    library = library_budgets(profile.scores, budget, reference, window=64)
    assert sum(library) == len(library) * int(budget * reference)  # the library's global budget L * average
    assert sum(fractions) * reference == pytest.approx(sum(library), abs=1e-6)
    assert len(set(fractions)) <= tiers
    counts = sorted(fractions.count(value) for value in set(fractions))
    assert all(c % (len(fractions) // tiers) == 0 for c in counts)  # tiers of equal size (equal means may merge)


@pytest.mark.parametrize("tiers", [1, 2, 3, 5, 6, 10, 15, 30])
def test_tiers_follow_the_profile_order(profile, tiers: int) -> None:
    fractions = tier_keep_fractions(profile, 0.2, tiers, 4096, window=64)
    scores = profile.scores
    for i in range(len(scores)):
        for j in range(len(scores)):
            if scores[i] < scores[j]:
                assert fractions[i] <= fractions[j], (tiers, i, j)


def test_library_budgets_are_the_presses_allocation(profile) -> None:
    # LayerBudgetPress with SnapKV's scorer: the RippleKV rule with the 64-token window as the per-layer floor
    config = AllocationConfig(ratio=32, gamma=30)
    budgets = library_budgets(profile.scores, 0.1, 1024, window=64, ratio=32, gamma=30)
    assert budgets == allocate(profile.scores, 0.1, 1024, config, min_tokens=64).budgets
    assert budgets != allocate(profile.scores, 0.1, 1024, config, min_tokens=1).budgets  # the floor binds


def test_one_tier_per_layer_is_the_library_allocation(profile) -> None:
    fractions = tier_keep_fractions(profile, 0.2, 30, 4096, window=64)
    library = library_budgets(profile.scores, 0.2, 4096, window=64)
    assert [round(f * 4096) for f in fractions] == list(library)
    assert len(set(library)) > 3  # the profile really spreads the budget


def test_one_tier_is_uniform(profile) -> None:
    fractions = tier_keep_fractions(profile, 0.2, 1, 4096, window=64)
    assert fractions == pytest.approx([int(0.2 * 4096) / 4096] * 30)


def test_group_means_by_rank() -> None:
    # ranked by value: (0.1, 0.2) | (0.3, 0.9)
    assert group_into_tiers([0.9, 0.1, 0.3, 0.2], [4, 1, 3, 2], 2) == pytest.approx((0.6, 0.15, 0.6, 0.15))
    # equal values straddling the tier boundary: the more sensitive layer goes to the upper tier
    assert group_into_tiers([0.2, 0.2, 0.2, 0.6], [3, 1, 2, 0], 2) == pytest.approx((0.4, 0.2, 0.2, 0.4))
    assert group_into_tiers([0.2, 0.2, 0.2, 0.6], [3, 1, 2, 0], 2, ascending_scores=False) == pytest.approx(
        (0.2, 0.4, 0.2, 0.4)
    )
    assert group_into_tiers([0.5, 0.5, 0.5, 0.5], [4, 1, 3, 2], 2) == (0.5,) * 4
    with pytest.raises(ValueError, match="dividing the 4 layers"):
        group_into_tiers([0.5] * 4, [1, 2, 3, 4], 3)


def test_tiers_import_no_kvpress() -> None:
    code = "import sys, ripplekv_vllm.tiers, ripplekv_vllm.config; print('kvpress' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path.cwd())
    assert out.stdout.strip() == "False"
    assert json.loads(PROFILE.read_text())["model"]["num_hidden_layers"] == 30
