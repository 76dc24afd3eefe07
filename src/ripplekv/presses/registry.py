"""``make_press``: a method's press by name, built by its factory here (the methods and their parameters are
:data:`~ripplekv.presses.method_spec.METHOD_TABLE`). kvpress's own presses compress global layers only
(:class:`GlobalLayersPress`), as the schedules do.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass

from kvpress import AdaKVPress, PyramidKVPress, ScorerPress, SnapKVPress, StreamingLLMPress
from kvpress.presses.base_press import BasePress

from ripplekv.allocation import (
    DEFAULT_GAMMA,
    DEFAULT_RATIO,
    AllocationConfig,
    BudgetSpec,
    CakeRule,
    DynamicKVRule,
    LavaRule,
    PerPromptRule,
    PerPromptSchedule,
    PyramidSchedule,
    SqueezeAttentionRule,
    UniformSchedule,
)
from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.lava_press import LavaPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.memoized_scorer_press import MemoizedScorerPress
from ripplekv.presses.method_spec import METHOD_TABLE, MethodSpec, base_method, parse_method
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress, scorer_window
from ripplekv.presses.ripplekv_press import RippleKVPress, resolve_profile
from ripplekv.presses.scorers import make_scorer
from ripplekv.profiling.damage_profile import ORACLE_METHOD, require_damage_profile
from ripplekv.profiling.profile import SensitivityProfile

DEFAULT_WINDOW = 64


METHODS: tuple[str, ...] = tuple(METHOD_TABLE)
"""Every method name, in the table's order."""

FRACTION_ONLY_METHODS: tuple[str, ...] = tuple(name for name, m in METHOD_TABLE.items() if not m.takes_tokens)
"""kvpress's own presses: configured by ``compression_ratio``, they take a kept fraction, not ``tokens``."""

METHODS_WITHOUT_SCORER: tuple[str, ...] = tuple(name for name, m in METHOD_TABLE.items() if not m.has_scorer)
"""Methods with no token scorer to replace: they run once whatever scorers an evaluation names."""
_NO_SCORER = frozenset(METHODS_WITHOUT_SCORER)


DEFAULT_PRESS_BUDGET = 1.0
"""The kept fraction of :func:`make_press` given neither ``budget`` nor ``tokens`` (nothing is compressed)."""


@dataclass(frozen=True)
class _Build:
    """What a method's factory gets: the parsed spec, the budget, the profile and the scorer factory."""

    method: MethodSpec
    spec: BudgetSpec
    profile: SensitivityProfile | None
    window: int
    strict: bool
    scorer: Callable[[], ScorerPress]

    def fraction(self) -> float:
        if self.spec.budget is None:
            raise ValueError(
                f"{self.method.name} is kvpress's own press, configured by a compression ratio: it takes a kept "
                f"fraction (budget=), not tokens={self.spec.tokens}"
            )
        return float(self.spec.budget)

    def needs_profile(self) -> SensitivityProfile:
        if self.profile is None:
            raise ValueError(f"method {self.method.name!r} needs a sensitivity profile (run `ripplekv profile` first)")
        return self.profile

    def ripple(self, profile: SensitivityProfile, signal: str = "kl") -> RippleKVPress:
        """RippleKV's press over the scorer with this method's ``r`` and ``gamma``."""
        config = self.method.config(AllocationConfig)
        return RippleKVPress(
            self.scorer(),
            **self.spec.kwargs(),
            profile=profile,
            signal=signal,
            ratio=config.ratio,
            gamma=config.gamma,
            strict_profile=self.strict,
        )

    def per_prompt(self, rule: type[PerPromptRule]) -> PerPromptBudgetPress:
        """``rule``'s per-prompt press over the scorer, reserving the window the scorer keeps (none without one)."""
        inner = self.scorer()
        window = self.method.values.get("window") or int(getattr(inner, "window_size", None) or self.window)
        schedule = PerPromptSchedule(self.method.config(rule), **self.spec.kwargs(), window_size=scorer_window(inner))
        return PerPromptBudgetPress(inner, schedule, statistic_window=window)


def build_full(b: _Build) -> BasePress:
    return FullPress()


def build_streamingllm(b: _Build) -> BasePress:
    return GlobalLayersPress(StreamingLLMPress(compression_ratio=1 - b.fraction(), n_sink=b.method.values["n_sink"]))


def build_snapkv(b: _Build) -> BasePress:
    return LayerBudgetPress(b.scorer(), UniformSchedule(**b.spec.kwargs()))


def build_pyramidkv(b: _Build) -> BasePress:
    schedule = PyramidSchedule(**b.spec.kwargs(), window_size=b.window, beta=b.method.values["beta"])
    return LayerBudgetPress(b.scorer(), schedule)


def build_pyramidkv_kvpress(b: _Build) -> BasePress:
    return GlobalLayersPress(PyramidKVPress(compression_ratio=1 - b.fraction(), window_size=b.window))


def build_adakv(b: _Build) -> BasePress:
    scorer = MemoizedScorerPress(press=b.scorer(), compression_ratio=1 - b.fraction())
    return GlobalLayersPress(AdaKVPress(scorer, alpha_safeguard=b.method.values["alpha_safeguard"]))


def build_ripplekv(b: _Build) -> BasePress:
    return b.ripple(b.needs_profile())


def build_ripplekv_local(b: _Build) -> BasePress:
    return b.ripple(b.needs_profile(), signal="local")


def build_ripplekv_oracle(b: _Build) -> BasePress:
    return b.ripple(require_damage_profile(ORACLE_METHOD, b.profile))


def build_ripplekv_ada(b: _Build) -> BasePress:
    """RippleKV's per-layer budgets (the ``ripplekv`` schedule, same floor) with AdaKV's head-wise allocation."""
    ripple = b.ripple(b.needs_profile())
    return LayerBudgetAdaPress(b.scorer(), ripple.schedule, profile=b.profile, strict_profile=b.strict)


def build_cake(b: _Build) -> BasePress:
    return b.per_prompt(CakeRule)


def build_squeezeattention(b: _Build) -> BasePress:
    return b.per_prompt(SqueezeAttentionRule)


def build_dynamickv(b: _Build) -> BasePress:
    return b.per_prompt(DynamicKVRule)


def build_lava_layer(b: _Build) -> BasePress:
    return b.per_prompt(LavaRule)


def build_lava(b: _Build) -> BasePress:
    """LAVa complete: ``lava-layer``'s press (its layer budgets) with LAVa's head-wise split inside each layer."""
    layer = b.per_prompt(LavaRule)
    return LavaPress(
        layer.press, layer.schedule, statistic_window=layer.statistic_window, floor_alpha=b.method.values["floor_alpha"]
    )


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
    name: str | MethodSpec,
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
    """Build the press of a method by name.

    Args:
        name: a method of :data:`~ripplekv.presses.method_spec.METHOD_TABLE`, optionally with its parameters
            (``"cake:tau1=2,tau2=0.5"``, ``"ripplekv:r=16,gamma=12"``), or a :class:`MethodSpec`.
        budget: kept fraction of the prompt in (0, 1] (above 1 is an error: use ``tokens``); with neither
            ``budget`` nor ``tokens``, :data:`DEFAULT_PRESS_BUDGET`.
        profile: sensitivity profile, or the path of its JSON file; required by the ``ripplekv`` methods
            (``ripplekv-oracle``: a damage profile written by ``ripplekv analyze``).
        window_size: SnapKV's observation window (the default scorer's, PyramidKV's, kvpress's presses').
        ratio: RippleKV's disparity ``r``, as ``r=`` in ``name`` (both given and different: an error).
        strict_profile: a profile of other weights than the model's is an error instead of a warning.
        tokens: instead of ``budget``, the average tokens kept per layer (not for :data:`FRACTION_ONLY_METHODS`).
        scorer: the token scorer (a kvpress ``ScorerPress`` or a name of :data:`~ripplekv.presses.scorers.SCORERS`;
            not for :data:`METHODS_WITHOUT_SCORER`); default SnapKV with ``window_size``. Each press gets a copy.

    Raises:
        ValueError: for an unknown name or parameter, a bad value, budget or window, ``tokens`` for a
            fraction-only method, or a missing profile.
        TypeError: if ``profile`` is neither a :class:`SensitivityProfile`, a path nor ``None``.
    """
    method = parse_method(name, **_ripple_overrides(name, ratio, gamma))
    key = method.name
    if not (isinstance(window_size, int) and window_size >= 1):
        raise ValueError(f"window_size must be a positive integer, got {window_size!r}")
    if budget is None and tokens is None:
        budget = DEFAULT_PRESS_BUDGET
    try:
        spec = BudgetSpec(budget, tokens)
    except ValueError as error:
        raise ValueError(f"make_press({name!r}): {error}") from None
    if scorer is not None:
        if key in _NO_SCORER:
            raise ValueError(f"method {name!r} has no token scorer to replace (scorer= applies to {_with_scorer()})")
        if isinstance(scorer, str):
            scorer = make_scorer(scorer, window_size)
        if not isinstance(scorer, ScorerPress):
            raise TypeError(f"scorer must be a kvpress ScorerPress or a scorer name, got {type(scorer).__name__}")

    def build_scorer() -> ScorerPress:
        return SnapKVPress(window_size=window_size) if scorer is None else copy.copy(scorer)

    factory = globals()[METHOD_TABLE[key].factory]
    return factory(_Build(method, spec, resolve_profile(profile), window_size, bool(strict_profile), build_scorer))


def _ripple_overrides(name: str, ratio: float, gamma: float) -> dict[str, float]:
    """``make_press``'s ``ratio`` and ``gamma`` as ``r`` and ``gamma`` of a method that has them (defaults omitted)."""
    method = METHOD_TABLE.get(base_method(name))
    if method is None or method.param("r") is None:
        return {}
    out = {}
    if float(ratio) != float(DEFAULT_RATIO):
        out["r"] = float(ratio)
    if float(gamma) != float(DEFAULT_GAMMA):
        out["gamma"] = float(gamma)
    return out


def _with_scorer() -> str:
    return ", ".join(name for name in METHODS if name not in _NO_SCORER)
