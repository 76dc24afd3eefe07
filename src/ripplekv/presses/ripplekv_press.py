"""RippleKVPress: :class:`LayerBudgetPress` with the RippleKV schedule of a sensitivity profile."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedModel

from ripplekv.allocation.budget import ProfileSchedule
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.profiling.profile import AppliedSetting, SensitivityProfile, resolve_setting

__all__ = ["DEFAULT_BUDGET", "SIGNALS", "RippleKVPress", "press_setting", "resolve_profile"]

SIGNALS = {"kl": "scores", "local": "local_scores"}
DEFAULT_BUDGET = 0.2  # the kept fraction given neither budget nor tokens


def resolve_profile(profile: object) -> SensitivityProfile | None:
    """A :class:`SensitivityProfile` from a profile, the path of its JSON file, or ``None``; else ``TypeError``."""
    if profile is None or isinstance(profile, SensitivityProfile):
        return profile
    if isinstance(profile, (str, os.PathLike)):
        return SensitivityProfile.load(profile)
    raise TypeError(
        f"profile must be a SensitivityProfile or the path of a profile JSON file, got {type(profile).__name__}"
    )


@dataclass
class RippleKVPress(LayerBudgetPress):
    """RippleKV (paper, 2026): each layer keeps the share of the budget its measured sensitivity asks for, by the
    :class:`ProfileSchedule` of the profile's per-layer scores (built once here).

    Args:
        budget: kept fraction in (0, 1]; with neither ``budget`` nor ``tokens``, :data:`DEFAULT_BUDGET`.
        profile: the model's sensitivity profile, or the path of its JSON file (checked against the model).
        scores: raw per-layer scores instead of a profile (exactly one of ``profile`` and ``scores``).
        signal: ``"kl"`` (downstream KL, the method) or ``"local"`` (the layer's own output change, an ablation).
        ratio, gamma: RippleKV's ``r`` and ``gamma``; neither given (None): the profile's chosen setting
            (``ripplekv profile``), else r 4 and gamma 3; either given: that pair, the other knob at its default
            (:func:`~ripplekv.profiling.profile.resolve_setting`). Resolved when built: afterwards they hold the
            values the schedule uses, and ``setting_source`` says where they came from (``explicit``, ``profile``
            or ``default``).
        strict_profile: a profile of other weights than the model's raises instead of warning once.
    """

    schedule: ProfileSchedule = field(init=False)
    floor: int | None = field(default=None, kw_only=True)
    budget: float | None = None
    profile: SensitivityProfile | str | os.PathLike[str] | None = None
    scores: Sequence[float] | None = None
    signal: str = "kl"
    ratio: float | None = None
    gamma: float | None = None
    strict_profile: bool = False
    tokens: int | None = field(default=None, kw_only=True)
    setting_source: str = field(init=False, default="default")

    def __post_init__(self) -> None:
        self.profile = resolve_profile(self.profile)
        if (self.profile is None) == (self.scores is None):
            raise ValueError("give exactly one of `profile` and `scores`")
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {tuple(SIGNALS)}, got {self.signal!r}")
        by_signal = self.scores if self.profile is None else getattr(self.profile, SIGNALS[self.signal])
        setting = resolve_setting(self.profile, self.ratio, self.gamma)
        self.ratio, self.gamma, self.setting_source = setting.ratio, setting.gamma, setting.source
        budget = DEFAULT_BUDGET if self.budget is None and self.tokens is None else self.budget
        self.schedule = ProfileSchedule(budget, tuple(by_signal), self.ratio, self.gamma, tokens=self.tokens)
        super().__post_init__()

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        if self.profile is not None:
            self.profile.check_model(model, strict=self.strict_profile)
        super().post_init_from_model(model)


def press_setting(press: object) -> AppliedSetting | None:
    """The RippleKV ``r`` and ``gamma`` a press runs with and where they came from (a :class:`RippleKVPress`, or a
    press recording one in its ``setting``, as ``ripplekv-ada``'s does); None for any other press."""
    if isinstance(press, RippleKVPress):
        return AppliedSetting(press.ratio, press.gamma, press.setting_source)  # type: ignore[arg-type]
    found = getattr(press, "setting", None)
    return found if isinstance(found, AppliedSetting) else None
