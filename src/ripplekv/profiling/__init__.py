"""Offline sensitivity profiling: calibration data in, a per-layer SensitivityProfile out.

Names resolve on first use (PEP 562), so torch-free modules (profile, haystack) import without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    "CalibrationSample": "ripplekv.profiling.calibration",
    "CalibrationSet": "ripplekv.profiling.calibration",
    "load_calibration": "ripplekv.profiling.calibration",
    "ProfileError": "ripplekv.profiling.profile",
    "ProfileWeightsWarning": "ripplekv.profiling.profile",
    "SensitivityProfile": "ripplekv.profiling.profile",
    "ProfilingConfig": "ripplekv.profiling.sensitivity",
    "profile_model": "ripplekv.profiling.sensitivity",
    "score_sample": "ripplekv.profiling.sensitivity",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ripplekv.profiling' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
