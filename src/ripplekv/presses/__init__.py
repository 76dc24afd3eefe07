"""KV-cache presses: per-layer budget schedules (SnapKV, PyramidKV, RippleKV, head-wise too), one name per method."""

from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.registry import FRACTION_ONLY_METHODS, METHOD_DESCRIPTIONS, METHODS, make_press
from ripplekv.presses.ripplekv_press import RippleKVPress

__all__ = [
    "FRACTION_ONLY_METHODS",
    "METHODS",
    "METHOD_DESCRIPTIONS",
    "FullPress",
    "GlobalLayersPress",
    "LayerBudgetAdaPress",
    "LayerBudgetPress",
    "RippleKVPress",
    "make_press",
]
