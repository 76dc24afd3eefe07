"""One name per method: ``make_press(name, budget=..., profile=...)``.

SnapKV, PyramidKV and RippleKV are one press, :class:`LayerBudgetPress` over SnapKV's scorer, with three
per-layer budget schedules (uniform, pyramid, profile); they keep the same total number of tokens at a given
budget. kvpress's own PyramidKVPress stays available as ``pyramidkv-kvpress`` for comparison.

Every method compresses a model's global layers only and leaves sliding-window layers whole (Gemma 3's local
layers, :mod:`ripplekv.models.layer_types`): the schedules spread the global layers' budget over them, and
kvpress's own presses are wrapped in :class:`GlobalLayersPress`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from kvpress import AdaKVPress, PyramidKVPress, SnapKVPress, StreamingLLMPress
from kvpress.presses.base_press import BasePress

from ripplekv.allocation import DEFAULT_GAMMA, DEFAULT_RATIO, PyramidSchedule, UniformSchedule
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.ripplekv_press import RippleKVPress, resolve_profile
from ripplekv.profiling.damage_profile import ORACLE_METHOD, require_damage_profile
from ripplekv.profiling.profile import SensitivityProfile

DEFAULT_WINDOW = 64


def _fraction(name: str, budget: float) -> float:
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and 0 < budget <= 1):
        raise ValueError(f"{name} takes a budget as a kept fraction in (0, 1], got {budget!r}")
    return float(budget)


def _needs_profile(name: str, profile: SensitivityProfile | None) -> SensitivityProfile:
    if profile is None:
        raise ValueError(f"method {name!r} needs a sensitivity profile (run `ripplekv profile` first)")
    return profile


def _ripplekv_ada(
    budget: float, profile: SensitivityProfile, window: int, ratio: float, gamma: float, strict: bool
) -> BasePress:
    """RippleKV's per-layer budgets (the ``ripplekv`` schedule, same floor) with AdaKV's head-wise allocation."""
    ripple = RippleKVPress(SnapKVPress(window_size=window), budget=budget, profile=profile, ratio=ratio, gamma=gamma)
    return LayerBudgetAdaPress(SnapKVPress(window_size=window), ripple.schedule, profile=profile, strict_profile=strict)


_BUILDERS: dict[str, Callable[..., BasePress]] = {
    "full": lambda budget, profile, window, ratio, gamma, strict: FullPress(),
    "streamingllm": lambda budget, profile, window, ratio, gamma, strict: GlobalLayersPress(
        StreamingLLMPress(compression_ratio=1 - _fraction("streamingllm", budget))
    ),
    "snapkv": lambda budget, profile, window, ratio, gamma, strict: LayerBudgetPress(
        SnapKVPress(window_size=window), UniformSchedule(_fraction("snapkv", budget))
    ),
    "pyramidkv": lambda budget, profile, window, ratio, gamma, strict: LayerBudgetPress(
        SnapKVPress(window_size=window), PyramidSchedule(_fraction("pyramidkv", budget), window_size=window)
    ),
    "pyramidkv-kvpress": lambda budget, profile, window, ratio, gamma, strict: GlobalLayersPress(
        PyramidKVPress(compression_ratio=1 - _fraction("pyramidkv-kvpress", budget), window_size=window)
    ),
    "adakv": lambda budget, profile, window, ratio, gamma, strict: GlobalLayersPress(
        AdaKVPress(SnapKVPress(compression_ratio=1 - _fraction("adakv", budget), window_size=window))
    ),
    "ripplekv": lambda budget, profile, window, ratio, gamma, strict: RippleKVPress(
        press=SnapKVPress(window_size=window),
        budget=budget,
        profile=_needs_profile("ripplekv", profile),
        ratio=ratio,
        gamma=gamma,
        strict_profile=strict,
    ),
    "ripplekv-local": lambda budget, profile, window, ratio, gamma, strict: RippleKVPress(
        press=SnapKVPress(window_size=window),
        budget=budget,
        profile=_needs_profile("ripplekv-local", profile),
        signal="local",
        ratio=ratio,
        gamma=gamma,
        strict_profile=strict,
    ),
    "ripplekv-ada": lambda budget, profile, window, ratio, gamma, strict: _ripplekv_ada(
        budget, _needs_profile("ripplekv-ada", profile), window, ratio, gamma, strict
    ),
    ORACLE_METHOD: lambda budget, profile, window, ratio, gamma, strict: RippleKVPress(
        press=SnapKVPress(window_size=window),
        budget=budget,
        profile=require_damage_profile(ORACLE_METHOD, profile),
        ratio=ratio,
        gamma=gamma,
        strict_profile=strict,
    ),
}

METHODS: tuple[str, ...] = tuple(_BUILDERS)

METHOD_DESCRIPTIONS: dict[str, str] = {
    "full": "full cache (no compression)",
    "streamingllm": "StreamingLLM (kvpress): attention sinks + recent tokens, uniform budgets",
    "snapkv": "SnapKV scorer, uniform per-layer budgets",
    "pyramidkv": "SnapKV scorer, PyramidKV schedule (authors' code: linear in depth, beta 20), SnapKV's total",
    "pyramidkv-kvpress": "kvpress 0.5.5 PyramidKVPress (falls back to uniform when prompt x budget / 20 < window)",
    "adakv": "AdaKV (kvpress): SnapKV scores, head-wise budgets within each layer (keys masked, not freed)",
    "ripplekv": "SnapKV scorer, RippleKV budgets from the profile's downstream-KL scores",
    "ripplekv-local": "SnapKV scorer, RippleKV budgets from the profile's local signal (ablation)",
    "ripplekv-ada": "SnapKV scores, RippleKV per-layer budgets, AdaKV head-wise allocation in each layer (keys masked)",
    ORACLE_METHOD: "SnapKV scorer, RippleKV budgets from a damage profile (measured single-layer damage; ceiling)",
}
"""One line per method name: what it computes (used by reports so every table says which is which)."""


def selection_window(press: BasePress | None) -> int:
    """The observation window a press needs at the end of the prompt (0 if none), its wrapped press's included."""
    window = 0
    while press is not None:
        window = max(window, int(getattr(press, "window_size", 0) or 0))
        press = getattr(press, "press", None)
    return window


def check_prompt_length(press: BasePress | None, prompt_tokens: int) -> None:
    """Raise ``ValueError`` if the prompt is not longer than the press's selection window."""
    window = selection_window(press)
    if window and prompt_tokens <= window:
        raise ValueError(
            f"the prompt has {prompt_tokens} tokens, not more than the {window}-token selection window of "
            f"{type(press).__name__}: use a longer prompt or a smaller window_size"
        )


def make_press(
    name: str,
    budget: float = 1.0,
    profile: SensitivityProfile | str | os.PathLike[str] | None = None,
    window_size: int = DEFAULT_WINDOW,
    ratio: float = DEFAULT_RATIO,
    gamma: float = DEFAULT_GAMMA,
    strict_profile: bool = False,
) -> BasePress:
    """Build the press of a method by name (see :data:`METHOD_DESCRIPTIONS`).

    Args:
        name: one of :data:`METHODS`: ``full``; ``snapkv``, ``pyramidkv``, ``ripplekv`` and ``ripplekv-local``
            (SnapKV's scorer under the uniform, PyramidKV, RippleKV and RippleKV-local-signal budget schedules,
            all keeping the same total); ``ripplekv-ada`` (the RippleKV budgets allocated over heads as AdaKV does,
            :class:`~ripplekv.presses.layer_budget_ada_press.LayerBudgetAdaPress`; with a uniform schedule that
            press keeps what ``adakv`` keeps); ``ripplekv-oracle`` (the RippleKV rule over a *damage* profile
            written by ``ripplekv analyze``, passed as ``profile``: see :mod:`ripplekv.profiling.damage_profile`);
            ``streamingllm``, ``adakv`` and ``pyramidkv-kvpress`` (kvpress's own
            presses).
        budget: kept fraction of the prompt in (0, 1]; ``ripplekv`` also takes an average token count > 1.
            Ignored by ``full``.
        profile: sensitivity profile, or the path of its JSON file; required by the ``ripplekv`` methods
            (``ripplekv-oracle``: a damage profile).
        window_size: SnapKV observation window (every method with SnapKV's scorer, AdaKV).
        ratio: RippleKV disparity ``r``.
        gamma: RippleKV clip bound.
        strict_profile: a profile measured on other weights than the model's (its weights fingerprint differs) is
            an error instead of a warning (see :meth:`ripplekv.profiling.SensitivityProfile.check_model`).

    Raises:
        ValueError: for an unknown name, a bad budget or window, or a missing profile.
        TypeError: if ``profile`` is neither a :class:`SensitivityProfile`, a path nor ``None``.
    """
    key = name.lower()
    if key not in _BUILDERS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    if not (isinstance(window_size, int) and window_size >= 1):
        raise ValueError(f"window_size must be a positive integer, got {window_size!r}")
    return _BUILDERS[key](budget, resolve_profile(profile), window_size, ratio, gamma, bool(strict_profile))
