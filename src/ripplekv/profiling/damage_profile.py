"""Damage profiles: the mean KL(full || that layer alone compressed) per layer that ``ripplekv analyze`` measures at
``extra["budget"]``, saved as a sensitivity profile (``local_scores`` repeat it; ``alpha`` 0). The RippleKV rule over
it (``ripplekv-oracle``) allocates from what compressing each layer alone measurably costs instead of the profile's
estimate: the reference an offline profile is compared against."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ripplekv.profiling.profile import SensitivityProfile

DAMAGE_KIND = "layer-damage"
ORACLE_METHOD = "ripplekv-oracle"


def _positive(budget: object, what: str) -> float:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"{what} must be a positive number, got {budget!r}")
    return float(budget)


def is_damage_profile(profile: SensitivityProfile) -> bool:
    """Whether ``profile`` is a damage profile (``extra["kind"] == "layer-damage"``)."""
    return isinstance(profile, SensitivityProfile) and profile.extra.get("kind") == DAMAGE_KIND


def damage_budget(profile: SensitivityProfile) -> float:
    """The budget a damage profile was measured at (a kept fraction, or tokens per layer); ValueError for another
    profile or a budget that is not a positive number."""
    if not is_damage_profile(profile):
        raise ValueError("not a damage profile (ripplekv analyze writes them): it has no damage budget")
    return _positive(profile.extra.get("budget"), "the damage profile's budget")


def require_damage_profile(method: str, profile: SensitivityProfile | None) -> SensitivityProfile:
    """``profile`` if it is a damage profile, else a ValueError saying what ``method`` needs."""
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
    """A damage profile: the mean over prompts of ``damage`` (one row per prompt, one mean KL per layer), tagged
    with its budget, the prompts (``calibration``: suite, count, a hash of their ids) and the ``scorer`` that
    compressed each layer (observation window ``window_size``)."""
    rows = [tuple(float(v) for v in row) for row in damage]
    if not rows:
        raise ValueError("a damage profile needs the damage of at least one prompt")
    width = len(rows[0])
    if width < 1 or any(len(row) != width for row in rows):
        raise ValueError("every prompt's damage must hold one value per layer")
    for i, row in enumerate(rows):
        if not all(math.isfinite(v) and v >= -1e-9 for v in row):
            raise ValueError(f"prompt {i}'s damage holds a non-finite or negative value: {row}")
    budget = _positive(budget, "budget")
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
        extra={"kind": DAMAGE_KIND, "budget": budget, "scorer": scorer, "window_size": int(window_size)},
        weights_fingerprint=weights_fingerprint,
    )


def select_oracle_profile(profiles: Sequence[SensitivityProfile], budget: float) -> SensitivityProfile:
    """The damage profile ``ripplekv-oracle`` uses at ``budget``: the one measured there (to 1e-9), or the only one."""
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
