"""RippleKV per-layer KV-cache budget allocation (RippleKV paper, 2026).

See :mod:`ripplekv.allocation.budgets` for the RippleKV rule and its guarantees, and
:mod:`ripplekv.allocation.schedules` for the per-layer budget schedules (uniform/SnapKV, pyramid/PyramidKV,
profile/RippleKV) that :class:`ripplekv.presses.LayerBudgetPress` applies. The per-prompt rules (CAKE,
SqueezeAttention, DynamicKV, LAVa: :mod:`ripplekv.allocation.cake`, ``squeezeattention``, ``dynamickv``,
``lava``) decide budgets from statistics every layer produces during the prefill
(:mod:`ripplekv.allocation.per_prompt`, :class:`PerPromptSchedule`).
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
from ripplekv.allocation.cake import CakeRule, CakeStatistic, cake_layer_statistic
from ripplekv.allocation.dynamickv import (
    DynamicKVRule,
    DynamicKVStatistic,
    dynamickv_layer_statistic,
    dynamickv_pooled_scores,
)
from ripplekv.allocation.lava import LavaRule, LavaStatistic, lava_layer_statistic
from ripplekv.allocation.per_prompt import PerPromptRule, PerPromptSchedule
from ripplekv.allocation.schedules import (
    BudgetSchedule,
    ProfileSchedule,
    PyramidSchedule,
    UniformSchedule,
    check_budget,
)
from ripplekv.allocation.squeezeattention import (
    SqueezeAttentionRule,
    SqueezeStatistic,
    kmeans_1d,
    squeeze_layer_statistic,
)

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_GAMMA",
    "DEFAULT_RATIO",
    "Allocation",
    "AllocationConfig",
    "BudgetSchedule",
    "CakeRule",
    "CakeStatistic",
    "DynamicKVRule",
    "DynamicKVStatistic",
    "LavaRule",
    "LavaStatistic",
    "PerPromptRule",
    "PerPromptSchedule",
    "ProfileSchedule",
    "PyramidSchedule",
    "SqueezeAttentionRule",
    "SqueezeStatistic",
    "UniformSchedule",
    "allocate",
    "allocate_budgets",
    "cake_layer_statistic",
    "check_budget",
    "dynamickv_layer_statistic",
    "dynamickv_pooled_scores",
    "kmeans_1d",
    "lava_layer_statistic",
    "layer_weights",
    "normalize_scores",
    "resolve_average_budget",
    "scale_to_total",
    "squeeze_layer_statistic",
]
