"""KV-cache presses, one per method. The names below are imported on first use (PEP 562), so the torch-free modules
(:mod:`~ripplekv.presses.method_spec`, :mod:`~ripplekv.presses.descriptions`) load without kvpress or torch."""

from __future__ import annotations

import importlib
from typing import Any

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

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "METHOD_DESCRIPTIONS":
        raise ImportError("ripplekv.presses.METHOD_DESCRIPTIONS is gone: use METHOD_TABLE[name].description")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ripplekv.presses' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
