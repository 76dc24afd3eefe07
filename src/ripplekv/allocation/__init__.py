"""RippleKV per-layer KV-cache budget allocation (RippleKV paper, 2026).

See :mod:`ripplekv.allocation.budgets` for the RippleKV rule and its guarantees, and
:mod:`ripplekv.allocation.schedules` for the per-layer budget schedules (uniform/SnapKV, pyramid/PyramidKV,
profile/RippleKV) that :class:`ripplekv.presses.LayerBudgetPress` applies. A budget is ``budget=`` (a kept
fraction in ``(0, 1]``) or ``tokens=`` (an average token count per layer), never both (:class:`BudgetSpec`).
"""

from ripplekv.allocation.budgets import (
    DEFAULT_CONFIG,
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    Allocation,
    AllocationConfig,
    BudgetSpec,
    TokenBudgetError,
    allocate,
    allocate_budgets,
    budget_value,
    check_budget,
    kept_ratio,
    layer_weights,
    normalize_scores,
    resolve_average_budget,
    scale_to_total,
    validate_scores,
)
from ripplekv.allocation.schedules import (
    BudgetSchedule,
    ProfileSchedule,
    PyramidSchedule,
    UniformSchedule,
)

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GAMMA",
    "DEFAULT_RATIO",
    "Allocation",
    "AllocationConfig",
    "BudgetSchedule",
    "BudgetSpec",
    "ProfileSchedule",
    "PyramidSchedule",
    "TokenBudgetError",
    "UniformSchedule",
    "allocate",
    "allocate_budgets",
    "budget_value",
    "check_budget",
    "kept_ratio",
    "layer_weights",
    "normalize_scores",
    "resolve_average_budget",
    "scale_to_total",
    "validate_scores",
]
