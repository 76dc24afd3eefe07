"""Offline sensitivity profiling: calibration data in, a per-layer SensitivityProfile out.

Names resolve on first use (PEP 562), so torch-free modules (profile, haystack) import without torch.
"""

from __future__ import annotations

from ripplekv.lazy import lazy_exports

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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
