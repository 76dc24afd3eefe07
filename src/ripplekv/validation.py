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
