"""Offline sensitivity profiling: calibration data in, a per-layer SensitivityProfile out."""

from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet, load_calibration
from ripplekv.profiling.profile import ProfileError, SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, norm_adaptive_noise, profile_model, score_sample

__all__ = [
    "CalibrationSample",
    "CalibrationSet",
    "ProfileError",
    "ProfilingConfig",
    "SensitivityProfile",
    "load_calibration",
    "norm_adaptive_noise",
    "profile_model",
    "score_sample",
]
