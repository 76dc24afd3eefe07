"""RippleKVPress: per-layer token budgets from a sensitivity profile, any kvpress scorer for selection."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress, SnapKVPress
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from ripplekv.allocation import DEFAULT_GAMMA, DEFAULT_RATIO
from ripplekv.allocation.budgets import BudgetSpec, check_budget
from ripplekv.allocation.schedules import ProfileSchedule
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.profiling.profile import SensitivityProfile

__all__ = ["DEFAULT_BUDGET", "SIGNALS", "RippleKVPress", "resolve_profile"]

SIGNALS = ("kl", "local")

DEFAULT_BUDGET = 0.2
"""The kept fraction of a :class:`RippleKVPress` given neither ``budget`` nor ``tokens``."""


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
    to ``LayerBudgetPress(press, ProfileSchedule(budget, scores, ratio, gamma, tokens=tokens), min_tokens)``
    (:attr:`layer_press`, rebuilt from the fields on each use), so both compress, check padding and switch
    the model to variable-length attention in the same way. The inner press is never mutated, so one instance
    can serve several models or threads.

    The budget is ``budget`` (a kept fraction) or ``tokens`` (an average token count per layer), not both;
    with neither, ``budget`` is :data:`DEFAULT_BUDGET` (0.2). ``compression_ratio`` is ``1 - budget`` for a
    fraction and raises :class:`~ripplekv.allocation.budgets.TokenBudgetError` for a token budget;
    :meth:`compression_ratio_for` takes the prompt length and serves both (see
    :class:`~ripplekv.presses.LayerBudgetPress` for how kvpress code reading the ratio behaves).

    Args:
        press: token scorer (default: ``SnapKVPress()``, window 64). Its ``compression_ratio`` is ignored.
        budget: kept fraction of the prompt in (0, 1] (the paper's 10/20/30%); a value above 1 is an error
            (use ``tokens``). The global budget is ``num_layers`` times the average it keeps per layer.
        profile: sensitivity profile of the model (a :class:`SensitivityProfile`), or the path of its JSON file
            (loaded at construction); checked against the model when the press is applied.
        scores: raw per-layer scores instead of a profile (exactly one of ``profile`` and ``scores``).
        signal: which profile signal to allocate from: ``"kl"`` (downstream KL, the method) or ``"local"``
            (the ablation using the layer's own attention-output change).
        ratio: disparity ``r`` of the multipliers ``r ** s_l`` (``1`` gives uniform budgets).
        gamma: multipliers are clipped to ``[1/gamma, gamma]``.
        min_tokens: smallest budget a layer may get (``>= 1``); default (None): the inner press's
            ``window_size`` if it has one (SnapKV always keeps its observation window), else 1.
        strict_profile: a profile of other weights than the model's (same architecture, another weights
            fingerprint: a fine-tune, another dtype) raises instead of warning once.
        tokens: instead of ``budget``, the average number of tokens kept per layer (an integer ``>= 1``; keyword
            only).
    """

    press: ScorerPress = field(default_factory=SnapKVPress)
    budget: float | None = None
    profile: SensitivityProfile | str | os.PathLike[str] | None = None  # a path is loaded in __post_init__
    scores: Sequence[float] | None = None
    signal: str = "kl"
    ratio: float = DEFAULT_RATIO
    gamma: float = DEFAULT_GAMMA
    min_tokens: int | None = None
    strict_profile: bool = False
    tokens: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self.profile = resolve_profile(self.profile)
        if (self.profile is None) == (self.scores is None):
            raise ValueError("give exactly one of `profile` and `scores`")
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {SIGNALS}, got {self.signal!r}")
        # self.schedule validates budget and tokens (the message naming this press), then the scores
        LayerBudgetPress(self.press, self.schedule, self.min_tokens)  # validates scorer and min_tokens

    @property
    def layer_scores(self) -> tuple[float, ...]:
        """The per-layer scores the budgets are allocated from."""
        if self.profile is not None:
            return tuple(self.profile.scores if self.signal == "kl" else self.profile.local_scores)
        return tuple(float(s) for s in self.scores or ())

    @property
    def spec(self) -> BudgetSpec:
        """The budget of the current fields (:data:`DEFAULT_BUDGET` when neither ``budget`` nor ``tokens`` is set).

        Raises:
            ValueError: if both are set, or the one set is invalid.
        """
        if self.budget is None and self.tokens is None:
            return BudgetSpec(budget=DEFAULT_BUDGET)
        return check_budget(self.budget, self.tokens, owner=type(self).__name__)

    @property
    def schedule(self) -> ProfileSchedule:
        """The RippleKV schedule of the current fields."""
        spec = self.spec
        return ProfileSchedule(spec.budget, self.layer_scores, self.ratio, self.gamma, tokens=spec.tokens)

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
        """Average fraction removed for a kept fraction: ``1 - budget`` (kvpress's convention).

        Raises:
            TokenBudgetError: for a token budget (use :meth:`compression_ratio_for`).
        """
        return self.spec.compression_ratio

    def compression_ratio_for(self, prompt_tokens: int) -> float:
        """Average fraction of a ``prompt_tokens``-token prompt removed, for both kinds (``1 - average / prompt``)."""
        return self.spec.compression_ratio_for(prompt_tokens)

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
