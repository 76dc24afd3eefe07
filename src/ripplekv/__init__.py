"""RippleKV: layer-wise KV-cache budgets from downstream sensitivity profiling.

Data flows one way through the package:

``models`` (load a model, cache views, variable-length attention) ->
``profiling`` (calibration data, sensitivity profile) ->
``allocation`` (per-layer budgets) ->
``presses`` (kvpress presses, one name per method) ->
``inference`` (prefill + decode) -> ``cli``.
"""

__version__ = "0.1.0"

from ripplekv.allocation import (  # noqa: E402
    AllocationConfig,
    BudgetSchedule,
    ProfileSchedule,
    PyramidSchedule,
    UniformSchedule,
    allocate,
    allocate_budgets,
)
from ripplekv.inference import generate_answer  # noqa: E402
from ripplekv.models import load_model, model_identity  # noqa: E402
from ripplekv.presses import METHODS, LayerBudgetPress, RippleKVPress, make_press  # noqa: E402
from ripplekv.profiling import ProfilingConfig, SensitivityProfile, profile_model  # noqa: E402

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
