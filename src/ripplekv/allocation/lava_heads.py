"""LAVa's head-wise split of a layer's budget: a joint top-k over the layer's heads, with a per-head floor.

Paper: Shen et al., "LAVa: Layer-wise KV Cache Eviction with Dynamic Budget Allocation", 2025,
arXiv:2509.09754. Source read: github.com/MGDDestiny/Lava at commit ``71d3cc89dfd10edf524e7eee2bb417b4a129f1b8``,
``adaptive_snapkv/monkeypatch/snapkv_utils.py``: ``LavaKVCluster.update_kv_gqa`` (the split) and
``re_update_kv_gqa`` (the same split at a smaller layer budget, truncating each head's sorted selection);
``experiments/LongBench/pred.py`` (``--floor_alpha`` default 0.2, ``--skip 0``, ``--normalize`` off).

The rule. A layer has ``H`` KV heads, prefix scores ``S[h, j]`` (``j`` over the ``P`` tokens before the
observation window) and keeps ``b`` prefix tokens per head on average (its budget minus the window every head
keeps on top). The ``H * b`` highest scores of the flattened ``H x P`` scores give each head a count ``c_h`` (the
code: ``torch.topk`` of the flattened sorted scores, indices ``// P``, ``scatter_add_``); head ``h`` then keeps its
own ``x_h = (1 - alpha) * c_h + alpha * b`` highest-scored prefix tokens (``floor_alpha``: ``alpha = 0.2``), so
every head keeps at least the floor ``alpha * b`` whatever its scores, and the layer keeps ``H * b`` in all.

Deviations from the authors' code (``docs/allocators.md``, LAVa):

* The floor is ``alpha`` times the layer's own ``b``. In the code, the decoder loop sets the per-layer floor on a
  misspelled attribute (``floor_capactiy``), so ``update_kv_gqa`` reads ``floor_capacity = int(alpha * C)`` from
  ``__init__``, ``C`` the *configured* capacity (window included) for every layer: a layer whose LAVa budget
  ``b_l`` is below ``C`` keeps more than ``H * b_l`` and the whole cache exceeds the total. Here the floor is the
  layer's (what AdaKV's code, which this split follows, does), so the total is exact.
* Exact integers: the code rounds each head (``torch.round(c_h * (1 - alpha) + floor)``), which need not sum to
  the layer's budget; here the exact shares ``x_h`` (rational) are rounded by largest remainder (ties: the larger
  ``c_h``, then the larger score mass ``sum_j S[h, j]``, then the lower head), so they sum to ``H * b`` exactly,
  each head gets ``floor(x_h)`` or ``ceil(x_h)`` (hence at least ``floor(alpha * b)`` and at most ``P``), and a head
  whose sorted scores dominate another's keeps at least as many. Where the code's rounding does sum to ``H * b``
  (and no share ends in one half) the two agree (tested).
* Ties at the top-k threshold are shared among the tied heads in proportion to their tied entries (fractional
  ``c_h``) instead of ``torch.topk``'s arbitrary order, so equal heads get equal shares.
* ``normalize`` (off in the authors' runs) and ``skip`` (0: every layer split) are not offered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from ripplekv.allocation.budget import largest_remainder
from ripplekv.validation import is_integer, is_real

__all__ = ["DEFAULT_FLOOR_ALPHA", "head_floor", "lava_head_budgets", "top_k_counts"]

DEFAULT_FLOOR_ALPHA = 0.2
"""LAVa's ``floor_alpha``: the share of a layer's per-head budget every head keeps (``pred.py``'s default, 0.2)."""


def _check_alpha(floor_alpha: object) -> Fraction:
    if not is_real(floor_alpha) or not 0 <= float(floor_alpha) <= 1:  # type: ignore[arg-type]
        raise ValueError(f"floor_alpha must be a real number in [0, 1], got {floor_alpha!r}")
    return Fraction(float(floor_alpha))  # type: ignore[arg-type]


def head_floor(per_head: int, floor_alpha: float = DEFAULT_FLOOR_ALPHA) -> int:
    """The fewest prefix tokens any head keeps: ``floor(floor_alpha * per_head)`` (exact).

    Args:
        per_head: the layer's average prefix tokens per head (``>= 0``).
        floor_alpha: LAVa's ``floor_alpha`` in ``[0, 1]``.

    Raises:
        ValueError: on a negative or non-integer ``per_head`` or an ``floor_alpha`` outside ``[0, 1]``.
    """
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


def top_k_counts(scores: Sequence[Sequence[float]] | np.ndarray, k: int) -> list[Fraction]:
    """How many of the ``k`` highest entries of a ``(heads, tokens)`` score array each head holds.

    Entries tied with the ``k``-th highest are shared among their heads in proportion to how many each holds, so
    the counts are exact fractions summing to ``k``, equal for heads with equal scores, and a head whose sorted
    scores dominate another's elementwise holds at least as many.

    Args:
        scores: ``(heads, tokens)`` finite real scores (higher is kept first).
        k: entries to take, in ``[0, heads * tokens]``.

    Raises:
        ValueError: on a malformed array or ``k`` out of range.
    """
    array = _score_array(scores)
    heads, tokens = array.shape
    if not is_integer(k) or not 0 <= k <= heads * tokens:
        raise ValueError(f"k must be an integer in [0, {heads * tokens}], got {k!r}")
    if k == 0:
        return [Fraction(0)] * heads
    flat = array.reshape(-1)
    threshold = np.partition(flat, flat.size - k)[flat.size - k]  # the k-th highest entry
    above = (array > threshold).sum(axis=1)
    tied = (array == threshold).sum(axis=1)
    rest = int(k) - int(above.sum())  # 1 <= rest <= tied.sum(): the tied entries taken
    return [Fraction(int(a)) + Fraction(rest * int(t), int(tied.sum())) for a, t in zip(above, tied)]


def lava_head_budgets(
    scores: Sequence[Sequence[float]] | np.ndarray,
    per_head: int,
    floor_alpha: float = DEFAULT_FLOOR_ALPHA,
) -> tuple[int, ...]:
    """Prefix tokens each KV head of a layer keeps under LAVa's head-wise split (see the module docstring).

    Args:
        scores: ``(heads, tokens)`` prefix scores of the layer (its observation window excluded), one row per KV
            head: LAVa's :func:`~ripplekv.allocation.lava.lava_token_scores` or any scorer's.
        per_head: the layer's average prefix tokens per head ``b``, in ``[0, tokens]``; the heads keep
            ``heads * per_head`` in all.
        floor_alpha: ``alpha`` in ``[0, 1]``: every head keeps at least ``floor(alpha * per_head)``; 1 gives every
            head ``per_head`` (no split), 0 the pure joint top-k.

    Returns:
        One integer per head in ``[head_floor(per_head, floor_alpha), tokens]``, summing to ``heads * per_head``.

    Raises:
        ValueError: on a malformed score array, ``per_head`` out of range or ``floor_alpha`` outside ``[0, 1]``.
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
