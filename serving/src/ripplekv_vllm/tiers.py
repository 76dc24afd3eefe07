"""Per-layer keep fractions of the RippleKV vLLM plugin: the library's allocation, grouped into a few tiers.

RippleKV ("RippleKV: Cross-Layer KV Cache Allocation via Perturbation Propagation", Xu et al., 2026) spends a
global KV-cache budget unevenly over the layers, from a per-layer sensitivity profile. The library computes the
per-layer token budgets of one prompt (:class:`ripplekv.allocation.ProfileSchedule`, the same profile JSON as
``ripplekv eval --profile``); vLLM, however, fixes each layer's cache spec when the engine starts and makes every
KV-cache group the same size (a group of fewer layers is padded), so the plugin serves a few *tiers* of equal
layer counts, each with one keep fraction.

:func:`tier_keep_fractions` computes the library's budgets at a reference prompt length, ranks the layers by
them (ties: the more sensitive layer, then the lower index, as the library breaks them), cuts the ranking into
``tiers`` runs of equal length and gives each run the mean kept fraction of its layers. The mean keeps the global
budget (the sum over layers) unchanged, up to float rounding, and a more sensitive layer never gets a smaller
fraction. Only :mod:`ripplekv.allocation` and :mod:`ripplekv.profiling.profile` are imported: neither imports
kvpress, which cannot be installed beside vLLM (their transformers pins conflict).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ripplekv.allocation import DEFAULT_GAMMA, DEFAULT_RATIO, ProfileSchedule
from ripplekv.profiling.profile import SensitivityProfile

__all__ = ["group_into_tiers", "library_budgets", "load_profile", "tier_keep_fractions"]


def load_profile(path: str | os.PathLike[str]) -> SensitivityProfile:
    """The RippleKV profile at ``path`` (:meth:`SensitivityProfile.load`: a NaN or missing score is an error).

    Args:
        path: a profile JSON written by ``ripplekv profile``.

    Raises:
        ripplekv.profiling.profile.ProfileError: a missing, malformed or non-finite profile.
    """
    return SensitivityProfile.load(path)


def library_budgets(
    scores: Sequence[float],
    budget: float,
    reference_tokens: int,
    window: int,
    ratio: float = DEFAULT_RATIO,
    gamma: float = DEFAULT_GAMMA,
) -> tuple[int, ...]:
    """The library's per-layer token budgets of a ``reference_tokens``-token prompt (RippleKV, Xu et al., 2026).

    Exactly what :class:`ripplekv.presses.LayerBudgetPress` keeps with a :class:`ProfileSchedule` and SnapKV's
    scorer: ``ProfileSchedule(budget, scores, ratio, gamma).layer_budgets(L, reference_tokens, floor=window)``.

    Args:
        scores: one finite sensitivity score per layer.
        budget: the global kept fraction of the prompt, in ``(0, 1]``.
        reference_tokens: the prompt length the budgets are computed for (``>= 1``).
        window: SnapKV's observation window, the library's per-layer floor.
        ratio: the allocation's disparity ``r``.
        gamma: the allocation's clip bound.

    Raises:
        ValueError: on invalid scores, budget or allocation parameters.
    """
    schedule = ProfileSchedule(budget, tuple(scores), ratio=ratio, gamma=gamma)
    return schedule.layer_budgets(len(schedule.scores), int(reference_tokens), int(window))


def group_into_tiers(
    values: Sequence[float], scores: Sequence[float], tiers: int, ascending_scores: bool = True
) -> tuple[float, ...]:
    """Replace each layer's value by the mean over its tier: ``tiers`` runs of equal length in rank order.

    Layers are ranked by ``(value, score, index)`` (score negated when ``ascending_scores`` is False), so a tier
    holds adjacent ranks and the tier means are non-decreasing along the ranking.

    Args:
        values: one value per layer (e.g. a kept fraction).
        scores: one sensitivity score per layer (the tie-breaker between equal values).
        tiers: the number of tiers, ``>= 1``, dividing ``len(values)``.
        ascending_scores: whether a higher score ranks higher among equal values (the library's ``ratio >= 1``).

    Raises:
        ValueError: if ``tiers`` does not divide the number of layers or the lengths differ.
    """
    n = len(values)
    if len(scores) != n:
        raise ValueError(f"{len(scores)} scores for {n} layers")
    if isinstance(tiers, bool) or not isinstance(tiers, int) or tiers < 1 or n % tiers:
        raise ValueError(f"tiers must be an integer >= 1 dividing the {n} layers (equal tier sizes), got {tiers!r}")
    sign = 1.0 if ascending_scores else -1.0
    order = sorted(range(n), key=lambda i: (values[i], sign * scores[i], i))
    size = n // tiers
    out = [0.0] * n
    for start in range(0, n, size):
        members = order[start : start + size]
        mean = sum(values[i] for i in members) / size
        for i in members:
            out[i] = min(mean, 1.0)
    return tuple(out)


def tier_keep_fractions(
    profile: SensitivityProfile,
    budget: float,
    tiers: int,
    reference_tokens: int,
    window: int,
    ratio: float = DEFAULT_RATIO,
    gamma: float = DEFAULT_GAMMA,
) -> tuple[float, ...]:
    """One keep fraction per layer: the library's RippleKV budgets at ``reference_tokens``, in ``tiers`` tiers.

    ``sum(result) * reference_tokens == sum(library_budgets(...))`` up to float rounding (the global budget
    ``L * average``), and ``profile.scores[i] < profile.scores[j]`` implies ``result[i] <= result[j]`` for
    ``ratio >= 1`` (the reverse for ``ratio < 1``).

    Args:
        profile: the sensitivity profile (one score per layer).
        budget: the global kept fraction of the prompt, in ``(0, 1]``.
        tiers: the number of tiers (``>= 1``, dividing the number of layers).
        reference_tokens: the prompt length the library's budgets are computed at (``>= 1``).
        window: SnapKV's observation window (the library's per-layer floor).
        ratio: the allocation's disparity ``r``.
        gamma: the allocation's clip bound.

    Raises:
        ValueError: on invalid allocation parameters or a ``tiers`` that does not divide the layers.
    """
    scores = profile.scores
    budgets = library_budgets(scores, budget, reference_tokens, window, ratio, gamma)
    fractions = [b / reference_tokens for b in budgets]
    return group_into_tiers(fractions, scores, tiers, ascending_scores=ratio >= 1)
