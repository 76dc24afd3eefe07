"""One name per method: ``make_press(name, budget=..., profile=...)`` or ``make_press(name, tokens=..., ...)``.

SnapKV, PyramidKV and RippleKV are one press, :class:`LayerBudgetPress` over SnapKV's scorer, with three
per-layer budget schedules (uniform, pyramid, profile); they keep the same total number of tokens at a given
budget. kvpress's own PyramidKVPress stays available as ``pyramidkv-kvpress`` for comparison.

Every method compresses a model's global layers only and leaves sliding-window layers whole (Gemma 3's local
layers, :mod:`ripplekv.models.layer_types`): the schedules spread the global layers' budget over them, and
kvpress's own presses are wrapped in :class:`GlobalLayersPress`.

A budget is ``budget=`` (a kept fraction in ``(0, 1]``) or ``tokens=`` (an average token count per layer). The
methods built on the per-layer schedules take either; kvpress's own presses (:data:`FRACTION_ONLY_METHODS`) are
configured by a compression ratio and take a fraction only.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable

from kvpress import AdaKVPress, PyramidKVPress, ScorerPress, SnapKVPress, StreamingLLMPress
from kvpress.presses.base_press import BasePress

from ripplekv.allocation import (
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    BudgetSpec,
    PyramidSchedule,
    UniformSchedule,
    check_budget,
)
from ripplekv.allocation.cake import CakeRule
from ripplekv.allocation.dynamickv import DynamicKVRule
from ripplekv.allocation.lava import LavaRule
from ripplekv.allocation.per_prompt import PerPromptRule, PerPromptSchedule
from ripplekv.allocation.squeezeattention import SqueezeAttentionRule
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.memoized_scorer_press import MemoizedScorerPress
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.ripplekv_press import RippleKVPress, resolve_profile
from ripplekv.presses.scorers import make_scorer
from ripplekv.profiling.damage_profile import ORACLE_METHOD, require_damage_profile
from ripplekv.profiling.profile import SensitivityProfile

DEFAULT_WINDOW = 64


FRACTION_ONLY_METHODS: tuple[str, ...] = ("streamingllm", "pyramidkv-kvpress", "adakv")
"""kvpress's own presses: configured by ``compression_ratio``, they take a kept fraction, not ``tokens``."""

METHODS_WITHOUT_SCORER: tuple[str, ...] = ("full", "streamingllm", "pyramidkv-kvpress")
"""Methods with no token scorer to replace: they run once whatever scorers an evaluation names."""
_NO_SCORER = frozenset(METHODS_WITHOUT_SCORER)


DEFAULT_PRESS_BUDGET = 1.0
"""The kept fraction of :func:`make_press` given neither ``budget`` nor ``tokens`` (nothing is compressed)."""


def _fraction(name: str, spec: BudgetSpec) -> float:
    if spec.budget is None:
        raise ValueError(
            f"{name} is kvpress's own press, configured by a compression ratio: it takes a kept fraction "
            f"(budget=), not tokens={spec.tokens}"
        )
    return float(spec.budget)


def _needs_profile(name: str, profile: SensitivityProfile | None) -> SensitivityProfile:
    if profile is None:
        raise ValueError(f"method {name!r} needs a sensitivity profile (run `ripplekv profile` first)")
    return profile


def _ripplekv_ada(
    spec: BudgetSpec,
    profile: SensitivityProfile,
    scorer: Callable[[], ScorerPress],
    ratio: float,
    gamma: float,
    strict: bool,
) -> BasePress:
    """RippleKV's per-layer budgets (the ``ripplekv`` schedule, same floor) with AdaKV's head-wise allocation."""
    ripple = RippleKVPress(scorer(), **spec.kwargs(), profile=profile, ratio=ratio, gamma=gamma)
    return LayerBudgetAdaPress(scorer(), ripple.schedule, profile=profile, strict_profile=strict)


def _per_prompt(rule: PerPromptRule) -> Callable[..., BasePress]:
    """The builder of a per-prompt schedule's method: the rule over the scorer, SnapKV's total, one window."""

    def build(spec: BudgetSpec, profile, window, ratio, gamma, strict, scorer) -> BasePress:  # noqa: ANN001
        inner = scorer()
        shared = int(getattr(inner, "window_size", None) or window)
        return PerPromptBudgetPress(inner, PerPromptSchedule(rule, **spec.kwargs(), window_size=shared))

    return build


_BUILDERS: dict[str, Callable[..., BasePress]] = {
    "full": lambda spec, profile, window, ratio, gamma, strict, scorer: FullPress(),
    "streamingllm": lambda spec, profile, window, ratio, gamma, strict, scorer: GlobalLayersPress(
        StreamingLLMPress(compression_ratio=1 - _fraction("streamingllm", spec))
    ),
    "snapkv": lambda spec, profile, window, ratio, gamma, strict, scorer: LayerBudgetPress(
        scorer(), UniformSchedule(**spec.kwargs())
    ),
    "pyramidkv": lambda spec, profile, window, ratio, gamma, strict, scorer: LayerBudgetPress(
        scorer(), PyramidSchedule(**spec.kwargs(), window_size=window)
    ),
    "pyramidkv-kvpress": lambda spec, profile, window, ratio, gamma, strict, scorer: GlobalLayersPress(
        PyramidKVPress(compression_ratio=1 - _fraction("pyramidkv-kvpress", spec), window_size=window)
    ),
    "adakv": lambda spec, profile, window, ratio, gamma, strict, scorer: GlobalLayersPress(
        AdaKVPress(
            MemoizedScorerPress(press=scorer(), compression_ratio=1 - _fraction("adakv", spec))
        )  # kvpress's AdaKV
    ),
    "ripplekv": lambda spec, profile, window, ratio, gamma, strict, scorer: RippleKVPress(
        press=scorer(),
        **spec.kwargs(),
        profile=_needs_profile("ripplekv", profile),
        ratio=ratio,
        gamma=gamma,
        strict_profile=strict,
    ),
    "ripplekv-local": lambda spec, profile, window, ratio, gamma, strict, scorer: RippleKVPress(
        press=scorer(),
        **spec.kwargs(),
        profile=_needs_profile("ripplekv-local", profile),
        signal="local",
        ratio=ratio,
        gamma=gamma,
        strict_profile=strict,
    ),
    "ripplekv-ada": lambda spec, profile, window, ratio, gamma, strict, scorer: _ripplekv_ada(
        spec, _needs_profile("ripplekv-ada", profile), scorer, ratio, gamma, strict
    ),
    "cake": _per_prompt(CakeRule()),
    "squeezeattention": _per_prompt(SqueezeAttentionRule()),
    "dynamickv": _per_prompt(DynamicKVRule()),
    "lava": _per_prompt(LavaRule()),
    ORACLE_METHOD: lambda spec, profile, window, ratio, gamma, strict, scorer: RippleKVPress(
        press=scorer(),
        **spec.kwargs(),
        profile=require_damage_profile(ORACLE_METHOD, profile),
        ratio=ratio,
        gamma=gamma,
        strict_profile=strict,
    ),
}

METHODS: tuple[str, ...] = tuple(_BUILDERS)


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
    budget: float | None = None,
    profile: SensitivityProfile | str | os.PathLike[str] | None = None,
    window_size: int = DEFAULT_WINDOW,
    ratio: float = DEFAULT_RATIO,
    gamma: float = DEFAULT_GAMMA,
    strict_profile: bool = False,
    *,
    tokens: int | None = None,
    scorer: ScorerPress | str | None = None,
) -> BasePress:
    """Build the press of a method by name (see :data:`~ripplekv.presses.descriptions.METHOD_DESCRIPTIONS`).

    Args:
        name: one of :data:`METHODS`: ``full``; ``snapkv``, ``pyramidkv``, ``ripplekv`` and ``ripplekv-local``
            (SnapKV's scorer under the uniform, PyramidKV, RippleKV and RippleKV-local-signal budget schedules,
            all keeping the same total); ``ripplekv-ada`` (the RippleKV budgets allocated over heads as AdaKV does,
            :class:`~ripplekv.presses.layer_budget_ada_press.LayerBudgetAdaPress`; with a uniform schedule that
            press keeps what ``adakv`` keeps); ``ripplekv-oracle`` (the RippleKV rule over a *damage* profile
            written by ``ripplekv analyze``, passed as ``profile``: see :mod:`ripplekv.profiling.damage_profile`);
            ``streamingllm``, ``adakv`` and ``pyramidkv-kvpress`` (kvpress's own
            presses).
        budget: kept fraction of the prompt in (0, 1] (a value above 1 is an error: use ``tokens``); with
            neither ``budget`` nor ``tokens``, :data:`DEFAULT_PRESS_BUDGET` (1.0). Ignored by ``full``.
        profile: sensitivity profile, or the path of its JSON file; required by the ``ripplekv`` methods
            (``ripplekv-oracle``: a damage profile).
        window_size: SnapKV observation window (every method with SnapKV's scorer, AdaKV).
        ratio: RippleKV disparity ``r``.
        gamma: RippleKV clip bound.
        strict_profile: a profile measured on other weights than the model's (its weights fingerprint differs) is
            an error instead of a warning (see :meth:`ripplekv.profiling.SensitivityProfile.check_model`).
        tokens: instead of ``budget``, the average number of tokens kept per layer (an integer ``>= 1``; keyword
            only). Taken by every method but kvpress's own presses (:data:`FRACTION_ONLY_METHODS`); validated, then
            ignored, by ``full``.
        scorer: the token scorer (any kvpress ``ScorerPress``, or a name of
            :data:`~ripplekv.presses.scorers.SCORERS` built with ``window_size``; keyword only) of every method
            built on a scorer: the schedules (``snapkv``, ``pyramidkv``, ``ripplekv``, ``ripplekv-local``,
            ``ripplekv-oracle``, the per-prompt ``cake``, ``squeezeattention``, ``dynamickv``, ``lava``), ``adakv``
            and ``ripplekv-ada``. Default SnapKV with ``window_size``. ``streamingllm``, ``pyramidkv-kvpress`` and
            ``full`` take none. Each press gets its own copy, so one scorer can build many presses.

    Raises:
        ValueError: for an unknown name, a bad budget or window, both ``budget`` and ``tokens``, ``tokens`` for
            one of :data:`FRACTION_ONLY_METHODS`, or a missing profile.
        TypeError: if ``profile`` is neither a :class:`SensitivityProfile`, a path nor ``None``.
    """
    key = name.lower()
    if key not in _BUILDERS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    if not (isinstance(window_size, int) and window_size >= 1):
        raise ValueError(f"window_size must be a positive integer, got {window_size!r}")
    if budget is None and tokens is None:
        budget = DEFAULT_PRESS_BUDGET
    spec = check_budget(budget, tokens, owner=f"make_press({name!r})")
    if scorer is not None:
        if key in _NO_SCORER:
            raise ValueError(f"method {name!r} has no token scorer to replace (scorer= applies to {_with_scorer()})")
        if isinstance(scorer, str):
            scorer = make_scorer(scorer, window_size)
        if not isinstance(scorer, ScorerPress):
            raise TypeError(f"scorer must be a kvpress ScorerPress or a scorer name, got {type(scorer).__name__}")

    def build_scorer() -> ScorerPress:
        return SnapKVPress(window_size=window_size) if scorer is None else copy.copy(scorer)

    return _BUILDERS[key](spec, resolve_profile(profile), window_size, ratio, gamma, bool(strict_profile), build_scorer)


def _with_scorer() -> str:
    return ", ".join(name for name in METHODS if name not in _NO_SCORER)
