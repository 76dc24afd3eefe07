"""RippleKVPress: per-layer token budgets from a sensitivity profile, any kvpress scorer for selection."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress, SnapKVPress
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from ripplekv.allocation import DEFAULT_GAMMA, DEFAULT_RATIO
from ripplekv.allocation.schedules import ProfileSchedule
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.profiling.profile import SensitivityProfile

__all__ = ["SIGNALS", "RippleKVPress", "resolve_profile"]

SIGNALS = ("kl", "local")


def resolve_profile(profile: object) -> SensitivityProfile | None:
    """A :class:`SensitivityProfile` from a profile, the path of a profile JSON file, or ``None``.

    Args:
        profile: ``None``, a :class:`SensitivityProfile`, or a ``str`` / ``os.PathLike`` path loaded with
            :meth:`SensitivityProfile.load`.

    Raises:
        TypeError: for anything else.
        ripplekv.profiling.ProfileError: if the file is missing or not a profile.
    """
    if profile is None or isinstance(profile, SensitivityProfile):
        return profile
    if isinstance(profile, (str, os.PathLike)):
        return SensitivityProfile.load(profile)
    raise TypeError(
        f"profile must be a SensitivityProfile or the path of a profile JSON file, got {type(profile).__name__}"
    )


@dataclass
class RippleKVPress(BasePress):
    """RippleKV (2026): give each layer the KV-cache budget its measured sensitivity asks for.

    Offline, :func:`ripplekv.profiling.profile_model` measures how much the model's output distribution
    moves when each layer's Value cache is perturbed (every layer, sliding-window ones included; on a model with
    sliding-window layers the budgets are allocated from the global layers' scores, over the global layers).
    Here those scores become per-layer token budgets
    (min-max normalise, ``w_l = ratio ** s_l``, clip to ``[1/gamma, gamma]``, rescale to the global budget;
    see :mod:`ripplekv.allocation`), and layer ``l`` keeps exactly its budget of the tokens ranked highest
    by the inner press's ``score()``. Token selection is the inner press's; only the count changes, and no
    extra model pass is run at inference.

    This is the profile-schedule case of :class:`~ripplekv.presses.LayerBudgetPress`: every call is delegated
    to ``LayerBudgetPress(press, ProfileSchedule(budget, scores, ratio, gamma), min_tokens)``
    (:attr:`layer_press`, rebuilt from the fields on each use), so both compress, check padding and switch
    the model to variable-length attention in the same way. The inner press is never mutated, so one instance
    can serve several models or threads.

    Parameters
    ----------
    press : ScorerPress
        Token scorer (default: ``SnapKVPress()``, window 64). Its ``compression_ratio`` is ignored.
    budget : float
        Kept fraction of the prompt in (0, 1] (the paper's 10/20/30%), or, when > 1, the average number of
        tokens kept per layer. The global budget is ``num_layers`` times that average.
    profile : SensitivityProfile | str | os.PathLike | None
        Sensitivity profile of the model, or the path of its JSON file (loaded at construction); checked
        against the model when the press is applied.
    scores : Sequence[float] | None
        Raw per-layer scores instead of a profile (exactly one of ``profile`` and ``scores``).
    signal : str
        Which profile signal to allocate from: ``"kl"`` (downstream KL, the method) or ``"local"``
        (the ablation using the layer's own attention-output change).
    ratio : float
        Disparity ``r`` of the multipliers ``r ** s_l`` (``1`` gives uniform budgets).
    gamma : float
        Multipliers are clipped to ``[1/gamma, gamma]``.
    min_tokens : int | None
        Smallest budget a layer may get (``>= 1``); default: the inner press's ``window_size`` if it has one
        (SnapKV always keeps its observation window), else 1.
    strict_profile : bool
        A profile of other weights than the model's (same architecture, another weights fingerprint: a
        fine-tune, another dtype) raises instead of warning once.
    """

    press: ScorerPress = field(default_factory=SnapKVPress)
    budget: float = 0.2
    profile: SensitivityProfile | str | os.PathLike[str] | None = None  # a path is loaded in __post_init__
    scores: Sequence[float] | None = None
    signal: str = "kl"
    ratio: float = DEFAULT_RATIO
    gamma: float = DEFAULT_GAMMA
    min_tokens: int | None = None
    strict_profile: bool = False

    def __post_init__(self) -> None:
        self.profile = resolve_profile(self.profile)
        if (self.profile is None) == (self.scores is None):
            raise ValueError("give exactly one of `profile` and `scores`")
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}, got {self.signal!r}")
        LayerBudgetPress(self.press, self.schedule, self.min_tokens)  # validates scorer, budget, scores, min_tokens

    @property
    def layer_scores(self) -> tuple[float, ...]:
        """The per-layer scores the budgets are allocated from."""
        if self.profile is not None:
            return tuple(self.profile.scores if self.signal == "kl" else self.profile.local_scores)
        return tuple(float(s) for s in self.scores or ())

    @property
    def schedule(self) -> ProfileSchedule:
        """The RippleKV schedule of the current fields."""
        return ProfileSchedule(self.budget, self.layer_scores, self.ratio, self.gamma)

    @property
    def layer_press(self) -> LayerBudgetPress:
        """The :class:`LayerBudgetPress` this press is (a new object built from the current fields)."""
        return LayerBudgetPress(self.press, self.schedule, self.min_tokens)

    @property
    def floor(self) -> int:
        """The smallest budget a layer gets: ``min_tokens``, else the scorer's window, else 1."""
        return self.layer_press.floor

    @property
    def compression_ratio(self) -> float:
        """Average fraction removed, when the budget is a fraction (kvpress convention)."""
        return 1.0 - self.budget if self.budget <= 1 else math.nan

    def layer_budgets(self, prompt_tokens: int, n_layers: int | None = None) -> tuple[int, ...]:
        """Tokens kept by each layer for a prompt of ``prompt_tokens`` tokens.

        ``n_layers`` defaults to the number of scores (any other number is a ``ValueError``); it is accepted so
        that every per-layer budget press answers ``layer_budgets(prompt_tokens, n_layers)``.
        """
        n_layers = len(self.layer_scores) if n_layers is None else n_layers
        return self.layer_press.layer_budgets(int(prompt_tokens), n_layers)

    def model_budgets(self, config: PretrainedConfig, prompt_tokens: int) -> tuple[int, ...]:
        """Tokens kept by every layer of a model (sliding-window layers: the whole prompt); see
        :meth:`LayerBudgetPress.model_budgets`."""
        return self.layer_press.model_budgets(config, int(prompt_tokens))

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Check the profile against ``model``, then apply :meth:`LayerBudgetPress.post_init_from_model`."""
        if self.profile is not None:
            self.profile.check_model(model, strict=self.strict_profile)
        self.layer_press.post_init_from_model(model)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`LayerBudgetPress.compress` with the profile schedule."""
        return self.layer_press.compress(module, hidden_states, keys, values, attentions, kwargs)
