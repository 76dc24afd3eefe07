"""RippleKV: layer-wise KV-cache budgets from downstream sensitivity profiling.

Layers import one way (``docs/architecture.md``, enforced by ``tests/test_imports.py``): ``models``,
``distributed``, ``allocation`` -> ``profiling`` -> ``presses`` -> ``inference`` -> ``cli``. The names below are
resolved on first use (PEP 562), so torch-free modules (``ripplekv report``) import no torch, transformers or kvpress.
"""

from __future__ import annotations

from ripplekv.lazy import lazy_exports
from ripplekv.version import __version__ as __version__

# public name -> the module that defines it
_EXPORTS = {
    "AllocationConfig": "ripplekv.allocation.budget",
    "BudgetSchedule": "ripplekv.allocation.budget",
    "ProfileSchedule": "ripplekv.allocation.budget",
    "PyramidSchedule": "ripplekv.allocation.schedules",
    "UniformSchedule": "ripplekv.allocation.schedules",
    "allocate": "ripplekv.allocation.budget",
    "generate_answer": "ripplekv.inference.generate",
    "load_model": "ripplekv.models.loading",
    "model_identity": "ripplekv.models.identity",
    "METHODS": "ripplekv.presses.registry",
    "LayerBudgetPress": "ripplekv.presses.layer_budget_press",
    "RippleKVPress": "ripplekv.presses.ripplekv_press",
    "make_press": "ripplekv.presses.registry",
    "ProfilingConfig": "ripplekv.profiling.sensitivity",
    "SensitivityProfile": "ripplekv.profiling.profile",
    "profile_model": "ripplekv.profiling.sensitivity",
    "profile_with_setting": "ripplekv.inference.setting",
}

__all__ = sorted([*_EXPORTS, "__version__"])

_REMOVED = {"allocate_budgets": "ripplekv.allocate(scores, ...).budgets"}

__getattr__, _dir, _names = lazy_exports(__name__, _EXPORTS, _REMOVED)


def __dir__() -> list[str]:
    return __all__
