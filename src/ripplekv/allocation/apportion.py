"""Integer apportionment: shares of a total proportional to weights, within bounds, summing exactly.

The last step of every per-layer budget schedule (:mod:`ripplekv.allocation.budgets`' RippleKV rule and
:mod:`ripplekv.allocation.schedules`' PyramidKV): water-filling in exact rational arithmetic, then
largest-remainder rounding, so results are deterministic and platform-independent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from ripplekv.validation import is_integer

__all__ = ["scale_to_total"]


def _water_fill(weights: Sequence[Fraction], total: int, low: int, high: int) -> list[Fraction]:
    """Exact real shares ``x_l = clip(t * w_l, low, high)`` with ``sum(x) == total``.

    Water-filling: layers whose proportional share crosses a bound are fixed at that bound and the rest of the
    budget is shared among the remaining layers in proportion to their weights, until no bound is violated.
    Each round fixes only the side (cap or floor) with the larger total violation, which is the side whose
    violators stay violators at the final level ``t``; requires ``len(w) * low <= total <= len(w) * high``.
    """
    shares: list[Fraction | None] = [None] * len(weights)
    free = list(range(len(weights)))
    remaining = Fraction(total)
    while free:
        level = remaining / sum(weights[i] for i in free)
        over = [i for i in free if level * weights[i] > high]
        under = [i for i in free if level * weights[i] < low]
        if not over and not under:
            for i in free:
                shares[i] = level * weights[i]
            break
        excess = sum((level * weights[i] - high for i in over), Fraction(0))
        deficit = sum((low - level * weights[i] for i in under), Fraction(0))
        fixed: list[tuple[int, int]] = []
        if excess >= deficit:
            fixed += [(i, high) for i in over]
        if deficit >= excess:
            fixed += [(i, low) for i in under]
        for i, bound in fixed:
            shares[i] = Fraction(bound)
            remaining -= bound
        fixed_ids = {i for i, _ in fixed}
        free = [i for i in free if i not in fixed_ids]
    return [share if share is not None else Fraction(0) for share in shares]


def largest_remainder(
    shares: Sequence[Fraction], weights: Sequence[Fraction], preference: Sequence[float], total: int
) -> list[int]:
    """Round exact shares summing to ``total`` to integers summing to ``total``.

    Every layer gets ``floor(x_l)``; the leftover units go to the largest fractional remainders, ties broken
    by larger weight, then larger ``preference``, then lower layer index. A layer gets at most ``ceil(x_l)``,
    so integer bounds that hold for the real shares also hold for the integers.
    """
    floors = [math.floor(share) for share in shares]
    leftover = total - sum(floors)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - floors[i]), -weights[i], -preference[i], i))
    budgets = list(floors)
    for i in order[:leftover]:
        budgets[i] += 1
    return budgets


def scale_to_total(
    weights: Sequence[float | Fraction],
    total: int,
    floor: int,
    cap: int,
    preference: Sequence[float] | None = None,
) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights``, within ``[floor, cap]``, summing to ``total``.

    The common last step of every per-layer budget schedule (RippleKV, PyramidKV): exact real shares
    ``x_l = clip(t * w_l, floor, cap)`` with ``sum(x) == total`` (water-filling), rounded by largest remainder
    (ties: larger weight, then larger ``preference``, then lower index). Shares are therefore monotone in the
    weights, and integer bounds that hold for the real shares hold for the integers. A ``floor`` above the
    average ``total // len(weights)`` cannot be met by every entry and is lowered to that average.

    Args:
        weights: one positive, finite weight per entry (floats are used exactly, as binary fractions).
        total: the integer sum the shares must reach, ``0 <= total <= len(weights) * cap``.
        floor: the smallest share (``>= 0``), lowered to ``cap`` and, when too large, to ``total // len(weights)``.
        cap: the largest share (``>= 0``).
        preference: tie-breaker between entries of equal weight and equal remainder (default: none).

    Returns:
        ``len(weights)`` integers in ``[min(floor, cap, total // len(weights)), cap]`` summing to ``total``.

    Raises:
        ValueError: on empty or non-positive weights, or a ``total``, ``floor`` or ``cap`` out of range.
    """
    if len(weights) == 0:
        raise ValueError("scale_to_total needs at least one weight")
    for name, value in (("total", total), ("floor", floor), ("cap", cap)):
        if not is_integer(value) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if not all(isinstance(w, Fraction) or math.isfinite(float(w)) for w in weights):
        raise ValueError(f"weights must be finite, got {list(weights)}")
    exact = [Fraction(w) if isinstance(w, Fraction) else Fraction(float(w)) for w in weights]
    if any(w <= 0 for w in exact):
        raise ValueError(f"weights must be positive, got {[float(w) for w in exact]}")
    n = len(exact)
    if total > n * cap:
        raise ValueError(f"a total of {total} does not fit in {n} shares of at most {cap}")
    low = min(int(floor), int(cap))
    if n * low > total:
        low = total // n
    shares = _water_fill(exact, int(total), low, int(cap))
    ties = [0.0] * n if preference is None else [float(p) for p in preference]
    return largest_remainder(shares, exact, ties, int(total))
