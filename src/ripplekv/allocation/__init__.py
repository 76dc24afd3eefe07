"""RippleKV per-layer KV-cache budget allocation (RippleKV paper, 2026).

See :mod:`ripplekv.allocation.budgets` for the RippleKV rule and its guarantees, and
:mod:`ripplekv.allocation.schedules` for the per-layer budget schedules (uniform/SnapKV, pyramid/PyramidKV,
profile/RippleKV) that :class:`ripplekv.presses.LayerBudgetPress` applies. A budget is ``budget=`` (a kept
fraction in ``(0, 1]``) or ``tokens=`` (an average token count per layer), never both (:class:`BudgetSpec`,
:mod:`ripplekv.allocation.budget_spec`).
The per-prompt rules (CAKE, SqueezeAttention, DynamicKV, LAVa: :mod:`ripplekv.allocation.cake`,
``squeezeattention``, ``dynamickv``, ``lava``) decide budgets from statistics every layer produces during the
prefill (:mod:`ripplekv.allocation.per_prompt`, :class:`PerPromptSchedule`).
"""

from ripplekv.allocation.apportion import scale_to_total
from ripplekv.allocation.budget_spec import (
    BudgetSpec,
    TokenBudgetError,
    budget_value,
    check_budget,
    kept_ratio,
    resolve_average_budget,
)
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
    validate_scores,
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
    "BudgetSpec",
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
    "TokenBudgetError",
    "UniformSchedule",
    "allocate",
    "allocate_budgets",
    "budget_value",
    "cake_layer_statistic",
    "check_budget",
    "dynamickv_layer_statistic",
    "dynamickv_pooled_scores",
    "kept_ratio",
    "kmeans_1d",
    "lava_layer_statistic",
    "layer_weights",
    "normalize_scores",
    "resolve_average_budget",
    "scale_to_total",
    "squeeze_layer_statistic",
    "validate_scores",
]
