"""Per-layer KV-cache budgets: what a budget is, its schedules and the RippleKV rule
(:mod:`~ripplekv.allocation.budget`), the baselines' schedules (:mod:`~ripplekv.allocation.schedules`: SnapKV,
PyramidKV), and the per-prompt rules decided from prefill statistics (:mod:`~ripplekv.allocation.per_prompt`: CAKE,
SqueezeAttention, DynamicKV, LAVa).

The names below resolve on first use (PEP 562): importing this package imports none of its modules.
"""

from __future__ import annotations

from ripplekv.lazy import lazy_exports

_MODULES = {
    "budget": (
        "DEFAULT_CONFIG",
        "DEFAULT_GAMMA",
        "DEFAULT_RATIO",
        "Allocation",
        "AllocationConfig",
        "BudgetSchedule",
        "BudgetSpec",
        "ProfileSchedule",
        "TokenBudgetError",
        "allocate",
        "compression_ratio_keeping",
        "layer_weights",
        "normalize_scores",
        "scale_to_total",
        "validate_scores",
    ),
    "cake": ("CakeRule", "CakeStatistic", "cake_layer_statistic"),
    "dynamickv": ("DynamicKVRule", "DynamicKVStatistic", "dynamickv_layer_statistic", "dynamickv_pooled_scores"),
    "lava": ("LavaRule", "LavaStatistic", "lava_layer_statistic"),
    "per_prompt": ("PerPromptRule", "PerPromptSchedule"),
    "schedules": ("PyramidSchedule", "UniformSchedule"),
    "squeezeattention": ("SqueezeAttentionRule", "SqueezeStatistic", "kmeans_1d", "squeeze_layer_statistic"),
}
# public name -> the module that defines it
_EXPORTS = {name: f"ripplekv.allocation.{module}" for module, names in _MODULES.items() for name in names}


REMOVED: dict[str, str] = {
    "allocate_budgets": "allocate(scores, ...).budgets",
    "budget_value": "ripplekv_eval.running.budget_rows.budget_value (results rows are the harness's)",
    "check_budget": "BudgetSpec(budget, tokens)",
    "kept_ratio": "compression_ratio_keeping",
    "resolve_average_budget": "BudgetSpec(budget, tokens).average(prompt_tokens)",
}
"""Names this package had, and what replaces each (an ``ImportError``, which ``from ... import`` passes on)."""

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, REMOVED)
