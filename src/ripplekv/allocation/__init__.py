"""RippleKV per-layer KV-cache budget allocation (RippleKV paper, 2026).

See :mod:`ripplekv.allocation.budgets` for the RippleKV rule and its guarantees, and
:mod:`ripplekv.allocation.schedules` for the per-layer budget schedules (uniform/SnapKV, pyramid/PyramidKV,
profile/RippleKV) that :class:`ripplekv.presses.LayerBudgetPress` applies.
"""

from ripplekv.allocation.budgets import (
    DEFAULT_CONFIG,
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    Allocation,
    AllocationConfig,
    allocate,
    allocate_budgets,
    layer_weights,
    normalize_scores,
    resolve_average_budget,
    scale_to_total,
)
from ripplekv.allocation.schedules import (
    BudgetSchedule,
    ProfileSchedule,
    PyramidSchedule,
    UniformSchedule,
    check_budget,
)

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GAMMA",
    "DEFAULT_RATIO",
    "Allocation",
    "AllocationConfig",
    "BudgetSchedule",
    "ProfileSchedule",
    "PyramidSchedule",
    "UniformSchedule",
    "allocate",
    "allocate_budgets",
    "check_budget",
    "layer_weights",
    "normalize_scores",
    "resolve_average_budget",
    "scale_to_total",
]
