"""``make_press``: a method's press by name, built by the factory :data:`~ripplekv.presses.method_spec.METHOD_TABLE`
names (RippleKV's here, the other methods' in :mod:`~ripplekv.presses.factories`)."""

from __future__ import annotations

import copy
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from kvpress import ScorerPress, SnapKVPress
from kvpress.presses.base_press import BasePress

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.presses.method_spec import METHOD_TABLE, MethodSpec, base_method, parse_method
from ripplekv.presses.ripplekv_press import RippleKVPress, resolve_profile
from ripplekv.presses.scorers import make_scorer
from ripplekv.profiling.profile import SensitivityProfile

DEFAULT_WINDOW = 64
METHODS: tuple[str, ...] = tuple(METHOD_TABLE)
FRACTION_ONLY_METHODS: tuple[str, ...] = tuple(name for name, m in METHOD_TABLE.items() if not m.takes_tokens)
METHODS_WITHOUT_SCORER: tuple[str, ...] = tuple(name for name, m in METHOD_TABLE.items() if not m.has_scorer)
DEFAULT_PRESS_BUDGET = 1.0  # given neither budget nor tokens: nothing is compressed


@dataclass(frozen=True)
class Build:
    """What a method's factory gets: the parsed spec, the budget, the profile and a scorer factory (a new copy)."""

    method: MethodSpec
    spec: BudgetSpec
    profile: SensitivityProfile | None
    window: int
    strict: bool
    scorer: Callable[[], ScorerPress]

    def needs_profile(self) -> SensitivityProfile:
        if self.profile is None:
            raise ValueError(f"method {self.method.name!r} needs a sensitivity profile (run `ripplekv profile` first)")
        return self.profile

    def ripple(self, profile: SensitivityProfile, signal: str = "kl") -> RippleKVPress:
        """RippleKV's press over the scorer with this method's ``r`` and ``gamma`` (None when not given: the press
        takes the profile's setting, else the defaults)."""
        values = self.method.values
        return RippleKVPress(
            self.scorer(),
            **self.spec.kwargs(),
            ratio=values["r"],
            gamma=values["gamma"],
            profile=profile,
            signal=signal,
            strict_profile=self.strict,
        )


def build_ripplekv(b: Build) -> RippleKVPress:
    return b.ripple(b.needs_profile())


def make_press(
    name: str | MethodSpec,
    budget: float | None = None,
    profile: SensitivityProfile | str | os.PathLike[str] | None = None,
    window_size: int = DEFAULT_WINDOW,
    ratio: float | None = None,
    gamma: float | None = None,
    strict_profile: bool = False,
    *,
    tokens: int | None = None,
    scorer: ScorerPress | str | None = None,
) -> BasePress:
    """The press of a method by name.

    Args:
        name: a method of :data:`~ripplekv.presses.method_spec.METHOD_TABLE`, optionally with its parameters
            (``"ripplekv:r=16,gamma=12"``), or a :class:`MethodSpec`.
        budget: kept fraction in (0, 1]; with neither ``budget`` nor ``tokens``, :data:`DEFAULT_PRESS_BUDGET`.
        profile: sensitivity profile or its JSON file, for the ``ripplekv`` methods (``ripplekv-oracle``: a damage
            profile written by ``ripplekv analyze``).
        window_size: SnapKV's observation window (the default scorer's, PyramidKV's, kvpress's presses').
        ratio, gamma: RippleKV's ``r`` and ``gamma``, as in ``name`` (both given and different: an error). Given
            neither here nor in ``name``, a RippleKV press takes the profile's chosen setting (``ripplekv profile``),
            else r 4 and gamma 3; given either, the pair is explicit and wins (the other knob at its default).
        strict_profile: a profile of other weights than the model's is an error instead of a warning.
        tokens: instead of ``budget``, the average tokens kept per layer (not for :data:`FRACTION_ONLY_METHODS`).
        scorer: a kvpress ``ScorerPress`` or a name of :data:`~ripplekv.presses.scorers.SCORERS` (default SnapKV
            with ``window_size``; not for :data:`METHODS_WITHOUT_SCORER`). Each press gets a copy.
    """
    entry = METHOD_TABLE.get(base_method(name))
    ripple = entry is not None and entry.param("r") is not None  # a RippleKV method: ratio and gamma are r and gamma
    given = {"r": ratio, "gamma": gamma} if ripple else {}
    method = parse_method(name, **{key: float(v) for key, v in given.items() if v is not None})
    if not (isinstance(window_size, int) and window_size >= 1):
        raise ValueError(f"window_size must be a positive integer, got {window_size!r}")
    budget = DEFAULT_PRESS_BUDGET if budget is None and tokens is None else budget
    try:
        spec = BudgetSpec(budget, tokens)
    except ValueError as error:
        raise ValueError(f"make_press({name!r}): {error}") from None
    if scorer is not None:
        if method.name in METHODS_WITHOUT_SCORER:
            with_scorer = ", ".join(m for m in METHODS if m not in METHODS_WITHOUT_SCORER)
            raise ValueError(f"method {name!r} has no token scorer to replace (scorer= applies to {with_scorer})")
        if isinstance(scorer, str):
            scorer = make_scorer(scorer, window_size)
        if not isinstance(scorer, ScorerPress):
            raise TypeError(f"scorer must be a kvpress ScorerPress or a scorer name, got {type(scorer).__name__}")
    build_scorer = partial(SnapKVPress, window_size=window_size) if scorer is None else partial(copy.copy, scorer)
    factory = pkgutil.resolve_name(f"ripplekv.presses.{METHOD_TABLE[method.name].factory}")
    return factory(Build(method, spec, resolve_profile(profile), window_size, bool(strict_profile), build_scorer))
