"""Offline sensitivity profiling: calibration data in, a per-layer SensitivityProfile out."""

from ripplekv.profiling.calibration import CalibrationSample, CalibrationSet, load_calibration
from ripplekv.profiling.damage_profile import DAMAGE_KIND, is_damage_profile, make_damage_profile
from ripplekv.profiling.profile import ProfileError, ProfileWeightsWarning, SensitivityProfile
from ripplekv.profiling.sensitivity import ProfilingConfig, norm_adaptive_noise, profile_model, score_sample

__all__ = [
    "DAMAGE_KIND",
    "CalibrationSample",
    "CalibrationSet",
    "ProfileError",
    "ProfileWeightsWarning",
    "ProfilingConfig",
    "SensitivityProfile",
    "is_damage_profile",
    "load_calibration",
    "make_damage_profile",
    "norm_adaptive_noise",
    "profile_model",
    "score_sample",
]
