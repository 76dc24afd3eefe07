"""SnapKV scores and kept positions against a plain re-derivation of kvpress 0.5.5's ``SnapKVPress.score``."""

from __future__ import annotations

import math

import pytest
import torch

from ripplekv_vllm.selection import kept_indices, snapkv_scores


def reference_scores(query: torch.Tensor, key: torch.Tensor, window: int, kernel: int) -> torch.Tensor:
    """kvpress's SnapKV score by loops: per query head, softmax of each window query over the keys it may see,
    mean over the window, zero-padded moving average of ``kernel`` (divided by ``kernel``), mean over the group."""
    n, heads, dim = key.shape
    groups = query.shape[1] // heads
    out = torch.zeros(heads, n - window, dtype=torch.float64)
    for qh in range(query.shape[1]):
        h = qh // groups
        mean = torch.zeros(n - window, dtype=torch.float64)
        for i in range(window):
            visible = n - window + i + 1
            logits = [float(query[i, qh] @ key[j, h]) / math.sqrt(dim) for j in range(visible)]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            mean += torch.tensor(weights[: n - window], dtype=torch.float64) / total / window
        pooled = torch.tensor(
            [
                sum(mean[j] for j in range(p - kernel // 2, p + kernel // 2 + 1) if 0 <= j < n - window) / kernel
                for p in range(n - window)
            ],
            dtype=torch.float64,
        )
        out[h] += pooled / groups
    return out


@pytest.mark.parametrize(("n", "window", "kernel", "heads", "groups"), [(40, 8, 5, 3, 3), (23, 5, 3, 2, 1)])
def test_scores_are_kvpress_snapkv(n: int, window: int, kernel: int, heads: int, groups: int) -> None:
    generator = torch.Generator().manual_seed(n)
    key = torch.randn(n, heads, 16, generator=generator)
    query = torch.randn(window, heads * groups, 16, generator=generator)
    scores = snapkv_scores(query, key, window, kernel)
    assert scores.shape == (heads, n - window)
    torch.testing.assert_close(scores.double(), reference_scores(query, key, window, kernel), rtol=1e-5, atol=1e-7)


def test_kept_positions_are_the_window_and_the_top_scores() -> None:
    generator = torch.Generator().manual_seed(0)
    n, window, full = 150, 40, 128  # the window [110, 150) reaches below T = 128
    scores = torch.rand(3, n - window, generator=generator)
    kept = kept_indices(scores, n, 64, full)  # 18 forced window positions + the top 46 of [0, 110)
    assert kept.shape == (64, 3)
    for h in range(3):
        chosen = kept[:, h].tolist()
        assert chosen == sorted(chosen)
        top = sorted(torch.argsort(scores[h], descending=True)[:46].tolist())
        assert chosen == top + list(range(n - window, full))


def test_window_inside_the_tail_keeps_only_top_scores() -> None:
    # N = 10 in blocks of 6: T = 6; a window of 2 lies in the tail [6, 10), so no position of [0, T) is forced,
    # and the scored positions 6 and 7 (tail, kept in place anyway) are never picked however high they score
    scores = torch.tensor([[0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 5.0, 6.0]])
    kept = kept_indices(scores, 10, 3, 6)
    assert kept[:, 0].tolist() == [0, 2, 4]


def test_too_few_slots_for_the_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot keep 10 of 128 tokens when 18 are forced"):
        kept_indices(torch.rand(3, 110), 150, 10, 128)
