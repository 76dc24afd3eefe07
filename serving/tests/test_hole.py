"""``hole()``: block-aligned eviction bounds, checked exhaustively over small prompts (pure arithmetic)."""

from __future__ import annotations

import itertools

import pytest

from ripplekv_vllm.hole import hole, min_kept_blocks, realised_budget, target_budget

FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.25, 1 / 3, 0.5, 0.7, 0.9, 0.99, 1.0)
GRID = list(itertools.product(range(1, 420, 7), FRACTIONS, (32, 64), (1, 8, 31, 64, 100)))


@pytest.mark.parametrize("block_size", [32, 64])
def test_bounds_are_block_aligned_and_keep_the_tail(block_size: int) -> None:
    for n, fraction, _, window in GRID:
        kept, full = hole(n, fraction, block_size, window)
        assert kept % block_size == 0 and full % block_size == 0, (n, fraction, window)
        assert 0 <= kept <= full <= n < full + block_size, (n, fraction, window)  # [T, N) is the partial block


def test_window_is_always_kept() -> None:
    for n, fraction, block_size, window in GRID:
        kept, full = hole(n, fraction, block_size, window)
        assert kept + (n - full) >= min(window, n), (n, fraction, block_size, window)
        # the window's positions below T (there are T - (N - w) of them) all fit in the k compacted slots
        assert kept >= full - max(n - window, 0) or n - window >= full, (n, fraction, block_size, window)


def test_realised_budget_is_within_half_a_block_unless_forced() -> None:
    for n, fraction, block_size, window in GRID:
        kept, full = hole(n, fraction, block_size, window)
        target = target_budget(n, fraction, window)
        realised = realised_budget(n, fraction, block_size, window)
        assert realised == kept + n - full
        assert realised >= target - block_size / 2, (n, fraction, block_size, window)
        forced = kept == min_kept_blocks(n, block_size, window) * block_size
        assert realised <= target + block_size / 2 or forced, (n, fraction, block_size, window)


def test_nothing_is_evicted_at_full_budget_or_within_the_window() -> None:
    for n, _, block_size, window in GRID:
        assert hole(n, 1.0, block_size, window) == (n // block_size * block_size,) * 2
        if n <= window:
            for fraction in FRACTIONS:
                kept, full = hole(n, fraction, block_size, window)
                assert kept == full, (n, fraction, block_size, window)


def test_more_budget_never_evicts_more() -> None:
    for n, block_size, window in itertools.product(range(1, 420, 5), (32, 64), (8, 64)):
        kept = [hole(n, f, block_size, window)[0] for f in FRACTIONS]
        assert kept == sorted(kept), (n, block_size, window, kept)


def test_known_values() -> None:
    # a 1,102-token prompt in 32-token blocks: T = 1088, tail of 14 tokens
    assert hole(1102, 0.25, 32, 64) == (256, 1088)  # target 275 -> 275 - 14 = 261 -> nearest block multiple 256
    assert hole(1102, 0.5, 32, 64) == (544, 1088)  # target 551 -> 537 -> 544
    assert hole(1102, 0.01, 32, 64) == (64, 1088)  # target raised to the window: 64 - 14 = 50 -> 2 blocks
    assert min_kept_blocks(1102, 32, 64) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0.5, 32, 64), "num_prompt_tokens must be an integer >= 1, got 0"),
        ((100, 0.0, 32, 64), "keep_fraction must be in (0, 1], got 0.0"),
        ((100, 1.5, 32, 64), "keep_fraction must be in (0, 1], got 1.5"),
        ((100, float("nan"), 32, 64), "keep_fraction must be in (0, 1], got nan"),
        ((100, 0.5, 0, 64), "block_size must be an integer >= 1, got 0"),
        ((100, 0.5, 32, 0), "window must be an integer >= 1, got 0"),
    ],
)
def test_bad_arguments(args: tuple, message: str) -> None:
    with pytest.raises(ValueError) as error:
        hole(*args)
    assert str(error.value) == message
