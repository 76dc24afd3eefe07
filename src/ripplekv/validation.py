"""Type checks shared by every layer (a leaf module: it imports nothing of ripplekv)."""

from __future__ import annotations

import numbers

import numpy as np


def is_integer(value: object) -> bool:
    """True for integers (Python or NumPy), excluding ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: object) -> bool:
    """True for real numbers (Python or NumPy), excluding ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: object, minimum: int = 1, allow_none: bool = False) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer (:func:`is_integer`) ``>= minimum`` (or
    None when ``allow_none``)."""
    if value is None and allow_none:
        return
    if not is_integer(value) or value < minimum:  # type: ignore[operator]
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
