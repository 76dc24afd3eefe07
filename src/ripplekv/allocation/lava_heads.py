"""LAVa's head-wise split of a layer's budget: a joint top-k over the layer's heads, with a per-head floor.

Shen et al., 2025, arXiv:2509.09754 (``LavaKVCluster.update_kv_gqa``). A layer of ``H`` KV heads keeps ``b``
prefix tokens per head on average; the ``H * b`` highest of its ``H x P`` prefix scores give head ``h`` a count
``c_h``, and it keeps its own ``x_h = (1 - alpha) * c_h + alpha * b`` best tokens (``floor_alpha``, 0.2), so every
head keeps at least ``alpha * b``. Deviations (the floor is the layer's own ``alpha * b``, not the code's
misspelled-attribute ``int(alpha * C)``; exact largest-remainder integers; shared ties): docs/allocators.md, "LAVa".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from ripplekv.allocation.budget import largest_remainder
from ripplekv.allocation.per_prompt import top_k_counts
from ripplekv.validation import is_integer, is_real

DEFAULT_FLOOR_ALPHA = 0.2
"""LAVa's ``floor_alpha``: the share of a layer's per-head budget every head keeps (``pred.py``'s default, 0.2)."""


def _check_alpha(floor_alpha: object) -> Fraction:
    if not is_real(floor_alpha) or not 0 <= float(floor_alpha) <= 1:  # type: ignore[arg-type]
        raise ValueError(f"floor_alpha must be a real number in [0, 1], got {floor_alpha!r}")
    return Fraction(float(floor_alpha))  # type: ignore[arg-type]


def head_floor(per_head: int, floor_alpha: float = DEFAULT_FLOOR_ALPHA) -> int:
    """The fewest prefix tokens any head keeps: ``floor(floor_alpha * per_head)``, exactly."""
    if not is_integer(per_head) or per_head < 0:
        raise ValueError(f"per_head must be an integer >= 0, got {per_head!r}")
    return math.floor(_check_alpha(floor_alpha) * int(per_head))


def _score_array(scores: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    try:
        array = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"scores must be a (heads, tokens) array of real numbers: {error}") from error
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"scores must be a non-empty (heads, tokens) array, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("scores must be finite")
    return array


def lava_head_budgets(
    scores: Sequence[Sequence[float]] | np.ndarray,
    per_head: int,
    floor_alpha: float = DEFAULT_FLOOR_ALPHA,
) -> tuple[int, ...]:
    """Prefix tokens each KV head of a layer keeps under LAVa's head-wise split, summing to ``heads * per_head``.

    ``scores`` are ``(heads, tokens)`` prefix scores (window excluded), one row per KV head. Each head gets
    ``floor(x_h)`` or ``ceil(x_h)`` (ties: larger ``c_h``, then larger score mass, then lower head), in
    ``[head_floor(per_head, floor_alpha), tokens]``; ``floor_alpha`` 1 is no split, 0 the pure joint top-k.
    """
    array = _score_array(scores)
    heads, tokens = array.shape
    alpha = _check_alpha(floor_alpha)
    if not is_integer(per_head) or not 0 <= per_head <= tokens:
        raise ValueError(f"per_head must be an integer in [0, {tokens}] (the prefix tokens), got {per_head!r}")
    total = heads * int(per_head)
    counts = top_k_counts(array, total)
    shares = [(1 - alpha) * c + alpha * int(per_head) for c in counts]
    mass = [float(m) for m in array.sum(axis=1)]
    return tuple(largest_remainder(shares, counts, mass, total))
