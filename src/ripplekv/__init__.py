"""RippleKV: layer-wise KV-cache budgets from downstream sensitivity profiling.

Data flows one way through the package (``docs/architecture.md``; ``tests/test_imports.py`` enforces it):
``models``, ``distributed``, ``allocation`` -> ``profiling`` -> ``presses`` -> ``inference`` -> ``evaluation`` ->
``analysis`` -> ``cli``. A layer imports only the layers before it.
"""

from ripplekv.allocation import (
    AllocationConfig,
    BudgetSchedule,
    ProfileSchedule,
    PyramidSchedule,
    UniformSchedule,
    allocate,
    allocate_budgets,
)
from ripplekv.inference import generate_answer
from ripplekv.models import load_model, model_identity
from ripplekv.presses import METHODS, LayerBudgetPress, RippleKVPress, make_press
from ripplekv.profiling import ProfilingConfig, SensitivityProfile, profile_model
from ripplekv.version import __version__

__all__ = [
    "METHODS",
    "AllocationConfig",
    "BudgetSchedule",
    "LayerBudgetPress",
    "ProfileSchedule",
    "ProfilingConfig",
    "PyramidSchedule",
    "RippleKVPress",
    "SensitivityProfile",
    "UniformSchedule",
    "__version__",
    "allocate",
    "allocate_budgets",
    "generate_answer",
    "load_model",
    "make_press",
    "model_identity",
    "profile_model",
]
