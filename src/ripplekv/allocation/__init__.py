"""Per-layer KV-cache budgets: what a budget is, its schedules and the RippleKV rule
(:mod:`~ripplekv.allocation.budget`), the baselines' schedules (:mod:`~ripplekv.allocation.schedules`: SnapKV,
PyramidKV), and the per-prompt rules decided from prefill statistics (:mod:`~ripplekv.allocation.per_prompt`: CAKE,
SqueezeAttention, DynamicKV, LAVa).
"""

from typing import Any

from ripplekv.allocation.budget import (
    DEFAULT_CONFIG,
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    Allocation,
    AllocationConfig,
    BudgetSchedule,
    BudgetSpec,
    ProfileSchedule,
    TokenBudgetError,
    allocate,
    compression_ratio_keeping,
    layer_weights,
    normalize_scores,
    scale_to_total,
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
from ripplekv.allocation.schedules import PyramidSchedule, UniformSchedule
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
    "cake_layer_statistic",
    "compression_ratio_keeping",
    "dynamickv_layer_statistic",
    "dynamickv_pooled_scores",
    "kmeans_1d",
    "lava_layer_statistic",
    "layer_weights",
    "normalize_scores",
    "scale_to_total",
    "squeeze_layer_statistic",
    "validate_scores",
]

REMOVED: dict[str, str] = {
    "allocate_budgets": "allocate(scores, ...).budgets",
    "budget_value": "ripplekv_eval.running.budget_rows.budget_value (results rows are the harness's)",
    "check_budget": "BudgetSpec(budget, tokens)",
    "kept_ratio": "compression_ratio_keeping",
    "resolve_average_budget": "BudgetSpec(budget, tokens).average(prompt_tokens)",
}
"""Names this package had, and what replaces each (an ``ImportError``, which ``from ... import`` passes on)."""


def __getattr__(name: str) -> Any:
    """Raise ``ImportError`` naming the replacement of a removed name; ``AttributeError`` for any other."""
    if name in REMOVED:
        raise ImportError(f"ripplekv.allocation.{name} is gone: use {REMOVED[name]}")
    raise AttributeError(f"module 'ripplekv.allocation' has no attribute {name!r}")
