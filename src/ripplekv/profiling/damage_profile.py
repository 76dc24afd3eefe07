"""Damage profiles: measured per-layer damage saved as a :class:`~ripplekv.profiling.SensitivityProfile`.

``ripplekv analyze`` measures, per prompt and layer, the fidelity loss of compressing that layer alone (see
:mod:`ripplekv_eval.analysis.damage`). Its mean per layer at one budget, saved in the sensitivity-profile format, is a
*damage profile*: the RippleKV rule allocated over it (the ``ripplekv-oracle`` method) is the ceiling any offline
per-layer profile can reach on those prompts. A damage profile is an ordinary profile file (same class, same
``ripplekv-profile/1`` format, checked against the model the same way) whose ``extra`` says what it is:

=====================  ==========================================================================================
``extra["kind"]``      ``"layer-damage"`` (:data:`DAMAGE_KIND`); a sensitivity profile has none
``extra["budget"]``    the budget the damage was measured at (a kept fraction, or tokens per layer)
``extra["scorer"]``    the method that compressed the one layer (``snapkv``) and ``extra["window_size"]`` its window
=====================  ==========================================================================================

``scores`` is the mean damage per layer (mean KL(full || one layer compressed) over the prompts), ``sample_scores``
each prompt's damage, and ``local_scores`` repeats ``scores`` (there is no local signal); ``alpha`` is 0 (no noise
was added) and ``calibration`` describes the prompts (suite, count, hash of their token ids).

The damage is measured on the prompts it is then evaluated on, so an oracle's fidelity on those prompts is an
in-sample ceiling, not a held-out result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ripplekv.profiling.profile import SensitivityProfile

__all__ = [
    "DAMAGE_KIND",
    "ORACLE_METHOD",
    "damage_budget",
    "is_damage_profile",
    "make_damage_profile",
    "require_damage_profile",
    "select_oracle_profile",
]

DAMAGE_KIND = "layer-damage"
ORACLE_METHOD = "ripplekv-oracle"


def is_damage_profile(profile: SensitivityProfile) -> bool:
    """Whether ``profile`` is a damage profile (``extra["kind"] == "layer-damage"``).

    Args:
        profile: any profile.
    """
    return isinstance(profile, SensitivityProfile) and profile.extra.get("kind") == DAMAGE_KIND


def damage_budget(profile: SensitivityProfile) -> float:
    """The budget a damage profile was measured at.

    Args:
        profile: a damage profile.

    Raises:
        ValueError: ``profile`` is not a damage profile, or its budget is missing or not a positive number.
    """
    if not is_damage_profile(profile):
        raise ValueError("not a damage profile (ripplekv analyze writes them): it has no damage budget")
    budget = profile.extra.get("budget")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"the damage profile's budget must be a positive number, got {budget!r}")
    return float(budget)


def require_damage_profile(method: str, profile: SensitivityProfile | None) -> SensitivityProfile:
    """``profile`` if it is a damage profile, else a ValueError saying what ``method`` needs.

    Args:
        method: the method's name (for the message).
        profile: the profile given to it.
    """
    if profile is None:
        raise ValueError(
            f"method {method!r} needs a damage profile (written by `ripplekv analyze`; `ripplekv eval` takes it "
            "as --oracle-profile)"
        )
    if not is_damage_profile(profile):
        raise ValueError(
            f"method {method!r} needs a damage profile (written by `ripplekv analyze`), got a sensitivity profile: "
            "pass it as --profile for the other ripplekv methods"
        )
    damage_budget(profile)
    return profile


def make_damage_profile(
    model: Mapping[str, Any],
    damage: Sequence[Sequence[float]],
    budget: float,
    calibration: Mapping[str, Any],
    scorer: str,
    window_size: int,
    library_version: str,
    weights_fingerprint: str | None = None,
) -> SensitivityProfile:
    """A damage profile: the mean of ``damage`` over prompts per layer, tagged with its budget.

    Args:
        model: the model's identity (:func:`ripplekv.models.model_identity`).
        damage: one row per prompt, one damage value (mean KL, nats) per layer.
        budget: the budget the one layer was compressed to.
        calibration: what the prompts were (suite, count, a hash of their token ids), recorded as the profile's
            ``calibration``.
        scorer: the method that compressed the layer (``snapkv``).
        window_size: its observation window.
        library_version: the ripplekv version measuring it.
        weights_fingerprint: digest of the model's weights (:func:`ripplekv.models.loading.weights_fingerprint`).

    Raises:
        ValueError: no prompt, rows of different lengths, a non-finite or negative damage, or a bad budget.
    """
    rows = [tuple(float(v) for v in row) for row in damage]
    if not rows:
        raise ValueError("a damage profile needs the damage of at least one prompt")
    width = len(rows[0])
    if width < 1 or any(len(row) != width for row in rows):
        raise ValueError("every prompt's damage must hold one value per layer")
    for i, row in enumerate(rows):
        if not all(math.isfinite(v) and v >= -1e-9 for v in row):
            raise ValueError(f"prompt {i}'s damage holds a non-finite or negative value: {row}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number, got {budget!r}")
    means = tuple(math.fsum(row[layer] for row in rows) / len(rows) for layer in range(width))
    return SensitivityProfile(
        model=dict(model),
        scores=means,
        sample_scores=tuple(rows),
        local_scores=means,
        alpha=0.0,
        repeats=1,
        seed=0,
        calibration=dict(calibration),
        library_version=library_version,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        extra={"kind": DAMAGE_KIND, "budget": float(budget), "scorer": scorer, "window_size": int(window_size)},
        weights_fingerprint=weights_fingerprint,
    )


def select_oracle_profile(profiles: Sequence[SensitivityProfile], budget: float) -> SensitivityProfile:
    """The damage profile ``ripplekv-oracle`` uses at ``budget``.

    The one measured at ``budget`` (to 1e-9); when a single damage profile is given, that one at every budget.

    Args:
        profiles: the damage profiles given (``--oracle-profile``).
        budget: the budget being run.

    Raises:
        ValueError: no profile, one that is not a damage profile, two at one budget, or several profiles none of
            which was measured at ``budget``.
    """
    if not profiles:
        raise ValueError(f"{ORACLE_METHOD} needs --oracle-profile (a damage profile from `ripplekv analyze`)")
    budgets = [damage_budget(require_damage_profile(ORACLE_METHOD, p)) for p in profiles]
    if len(profiles) == 1:
        return profiles[0]
    for i, b in enumerate(budgets):
        if any(math.isclose(b, other, rel_tol=0, abs_tol=1e-9) for other in budgets[:i]):
            raise ValueError(f"two damage profiles were measured at budget {b:g}: give one per budget")
    for profile, b in zip(profiles, budgets):
        if math.isclose(b, float(budget), rel_tol=0, abs_tol=1e-9):
            return profile
    have = ", ".join(f"{b:g}" for b in budgets)
    raise ValueError(f"no damage profile was measured at budget {budget:g} (the given ones are at {have})")
