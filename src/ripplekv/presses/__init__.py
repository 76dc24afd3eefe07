"""KV-cache presses, one per method. The names below are imported on first use (PEP 562), so the torch-free modules
(:mod:`~ripplekv.presses.method_spec`, :mod:`~ripplekv.presses.descriptions`) load without kvpress or torch."""

from __future__ import annotations

from ripplekv.lazy import lazy_exports

_EXPORTS = {
    "FRACTION_ONLY_METHODS": "ripplekv.presses.registry",
    "METHODS": "ripplekv.presses.registry",
    "METHOD_TABLE": "ripplekv.presses.method_spec",
    "FullPress": "ripplekv.presses.full_press",
    "GlobalLayersPress": "ripplekv.presses.global_layers_press",
    "LayerBudgetAdaPress": "ripplekv.presses.layer_budget_ada_press",
    "LayerBudgetPress": "ripplekv.presses.layer_budget_press",
    "RippleKVPress": "ripplekv.presses.ripplekv_press",
    "make_press": "ripplekv.presses.registry",
}

REMOVED = {"METHOD_DESCRIPTIONS": "METHOD_TABLE[name].description"}
"""Names this package had, and what replaces each."""

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, REMOVED)
