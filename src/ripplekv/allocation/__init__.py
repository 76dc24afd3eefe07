"""RippleKV per-layer KV-cache budget allocation (RippleKV paper, 2026).

See :mod:`ripplekv.allocation.budgets` for the rule and its guarantees.
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
)

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GAMMA",
    "DEFAULT_RATIO",
    "Allocation",
    "AllocationConfig",
    "allocate",
    "allocate_budgets",
    "layer_weights",
    "normalize_scores",
    "resolve_average_budget",
]
