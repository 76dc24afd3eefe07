"""``make_press``: a method's press by name, built by the factory its entry of
:data:`~ripplekv.presses.method_spec.METHOD_TABLE` holds."""

from __future__ import annotations

import copy
import os
from functools import partial

from kvpress import ScorerPress, SnapKVPress
from kvpress.presses.base_press import BasePress

from ripplekv.allocation.budget import BudgetSpec
from ripplekv.presses.method_spec import METHOD_TABLE, Build, MethodSpec, base_method, parse_method
from ripplekv.presses.ripplekv_press import resolve_profile
from ripplekv.presses.scorers import make_scorer
from ripplekv.profiling.profile import SensitivityProfile

DEFAULT_WINDOW = 64
METHODS: tuple[str, ...] = tuple(METHOD_TABLE)
FRACTION_ONLY_METHODS: tuple[str, ...] = tuple(name for name, m in METHOD_TABLE.items() if not m.takes_tokens)
METHODS_WITHOUT_SCORER: tuple[str, ...] = tuple(name for name, m in METHOD_TABLE.items() if not m.has_scorer)
DEFAULT_PRESS_BUDGET = 1.0  # given neither budget nor tokens: nothing is compressed


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
    entry = METHOD_TABLE.get(base_method(name))  # a method with r and gamma (RippleKV's) takes ratio and gamma
    given = {k: float(v) for k, v in (("r", ratio), ("gamma", gamma)) if v is not None and entry and entry.param(k)}
    method = parse_method(name, **given)
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
    build = Build(method, spec, resolve_profile(profile), window_size, bool(strict_profile), build_scorer)
    return METHOD_TABLE[method.name].factory(build)
