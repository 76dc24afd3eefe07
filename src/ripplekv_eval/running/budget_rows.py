"""A budget as results rows store it, one number: a kept fraction (``<= 1``, float) or tokens per layer (int)."""

from __future__ import annotations

import math

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.validation import is_real

__all__ = ["ROW_TOKENS_MIN", "budget_value", "row_budget", "row_value"]

ROW_TOKENS_MIN = 2
"""The smallest token count a row can store: 1 would read back as the kept fraction 1.0 (the full cache)."""


def row_value(spec: BudgetSpec) -> float | int:
    """``spec`` as a row's number: its fraction (float) or its token count (int, at least :data:`ROW_TOKENS_MIN`)."""
    if spec.tokens is None:
        return float(spec.budget)  # type: ignore[arg-type]
    if spec.tokens < ROW_TOKENS_MIN:
        raise ValueError(
            f"tokens={spec.tokens} has no numeric budget value: {spec.tokens} reads back as the kept fraction "
            f"{float(spec.tokens)} (the full cache); use tokens >= {ROW_TOKENS_MIN}"
        )
    return int(spec.tokens)


def row_budget(value: object) -> BudgetSpec:
    """The budget of a row's number (:func:`row_value`): ``0.1``, ``512`` or ``512.0``."""
    if not is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
        raise ValueError(f"a budget value is a kept fraction in (0, 1] or a whole token count >= 2, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if number <= 1:
        return BudgetSpec(budget=number)
    if not number.is_integer():
        raise ValueError(f"budget value {value!r} is above 1, so a token count, but not a whole number")
    return BudgetSpec(tokens=int(number))


def budget_value(value: object) -> float | int:
    """A row's ``budget`` number normalised (:func:`row_budget`, then :func:`row_value`)."""
    return row_value(row_budget(value))
