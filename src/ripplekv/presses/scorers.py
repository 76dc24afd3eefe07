"""Token scorers by name (``make_press(name, scorer="tova")``, ``eval --scorers``): each builds a fresh kvpress
``ScorerPress`` with kvpress 0.5.5's defaults, except where :data:`~ripplekv.presses.descriptions.SCORER_DESCRIPTIONS`
says. Not registered: the scorers that download from the Hugging Face hub, and ``PyramidKVPress`` (a schedule)."""

from __future__ import annotations

from collections.abc import Callable

from kvpress import (
    CompactorPress,
    CriticalKVPress,
    CURPress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    LagKVPress,
    LeverageScorePress,
    NonCausalAttnPress,
    ObservedAttentionPress,
    RandomPress,
    ScorerPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.presses.base_press import BasePress
from transformers import PreTrainedModel

from ripplekv.presses.lava_scorer import LavaScorerPress

__all__ = ["DEFAULT_SCORER", "NEEDS_ATTENTION_WEIGHTS", "SCORERS", "check_attention_weights", "make_scorer"]

DEFAULT_SCORER = "snapkv"
"""The scorer of every method unless another is named (the paper's: SnapKV over the observation window)."""

_FACTORIES: dict[str, Callable[[int], ScorerPress]] = {
    "snapkv": lambda window: SnapKVPress(window_size=window),
    "expected_attention": lambda window: ExpectedAttentionPress(),
    "tova": lambda window: TOVAPress(),
    "knorm": lambda window: KnormPress(),
    "keydiff": lambda window: KeyDiffPress(),
    "streaming_llm": lambda window: StreamingLLMPress(),
    "random": lambda window: RandomPress(seed=0),
    "lagkv": lambda window: LagKVPress(),
    "leverage": lambda window: LeverageScorePress(),
    "cur": lambda window: CURPress(),
    "compactor": lambda window: CompactorPress(),
    "non_causal_attention": lambda window: NonCausalAttnPress(),
    "critical_snapkv": lambda window: CriticalKVPress(press=SnapKVPress(window_size=window)),
    "observed_attention": lambda window: ObservedAttentionPress(),
    "lava": lambda window: LavaScorerPress(window_size=window),
}

SCORERS: tuple[str, ...] = tuple(_FACTORIES)
"""Every registered scorer name, the default first."""

NEEDS_ATTENTION_WEIGHTS: frozenset[type[ScorerPress]] = frozenset({ObservedAttentionPress})
"""Scorers (exact types) that score from the attention weights, which only eager attention returns (kvpress 0.5.5)."""


def check_attention_weights(scorer: BasePress, model: PreTrainedModel) -> None:
    """Raise ``ValueError`` if ``scorer`` (or a press it wraps as ``press``) reads the attention weights, which the
    model's attention does not return (kvpress would fail on a bare assertion at the first layer)."""
    implementation = str(model.config._attn_implementation)
    press: BasePress | None = scorer
    while press is not None:
        if type(press) in NEEDS_ATTENTION_WEIGHTS and "eager" not in implementation:
            raise ValueError(
                f"{type(press).__name__} scores tokens from the attention weights, which the attention "
                f"implementation {implementation!r} does not return: load the model with attn_implementation='eager'"
            )
        press = getattr(press, "press", None)


def make_scorer(name: str, window_size: int) -> ScorerPress:
    """A fresh scorer by name; ``window_size`` is used by those with a window (``snapkv``, ``lava``, ...)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown scorer {name!r}; choose one of {', '.join(SCORERS)}")
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"window_size must be a positive integer, got {window_size!r}")
    return _FACTORIES[name](window_size)
