"""KV-cache presses: per-layer budget schedules (SnapKV, PyramidKV, RippleKV, head-wise too), one name per method.

The names below are resolved on first use (PEP 562), so importing a torch-free module of the package
(:mod:`~ripplekv.presses.descriptions`, read by ``ripplekv report``) does not import kvpress or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
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
    """Import a public name's module on first use."""
    if name == "METHOD_DESCRIPTIONS":
        raise ImportError("ripplekv.presses.METHOD_DESCRIPTIONS is gone: use METHOD_TABLE[name].description")
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ripplekv.presses' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
