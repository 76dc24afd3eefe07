"""Token scorers by name: the second axis of a method (``make_press(name, scorer="tova")``, ``eval --scorers``).

A method is a per-layer budget schedule (uniform ``snapkv``, ``pyramidkv``, ``ripplekv``, the per-prompt
``cake``, ...) over a token scorer, a kvpress ``ScorerPress`` that ranks the prompt's tokens within each layer.
The schedule decides how many tokens a layer keeps, the scorer which ones. SnapKV's scorer is the default (the
paper's setting); every name here builds a fresh scorer with kvpress 0.5.5's defaults, except where a default
would make a run irreproducible or depend on the hub (noted in
:data:`~ripplekv.presses.descriptions.SCORER_DESCRIPTIONS`).

Scorers of kvpress 0.5.5 not registered here, and why (``tests/test_scorers.py`` tries every one):
``QFilterPress``, ``ExpectedAttentionStatsPress`` and ``KVzapPress`` download their filters, statistics or
scoring model from the Hugging Face hub; ``PyramidKVPress`` is a schedule, not a scorer (its SnapKV scores are
``snapkv``'s; its schedule is the ``pyramidkv`` method). ``ObservedAttentionPress`` is registered but needs a
model loaded with eager attention (the only implementation that returns attention weights).
"""

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

from ripplekv.presses.lava_scorer import LavaScorerPress

__all__ = ["DEFAULT_SCORER", "SCORERS", "make_scorer"]

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


def make_scorer(name: str, window_size: int) -> ScorerPress:
    """A fresh scorer by name.

    Args:
        name: one of :data:`SCORERS`.
        window_size: the observation window, used by the scorers that have one (``snapkv``, ``critical_snapkv``,
            ``lava``).

    Raises:
        ValueError: for an unknown name or a window that is not a positive integer.
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown scorer {name!r}; choose one of {', '.join(SCORERS)}")
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"window_size must be a positive integer, got {window_size!r}")
    return _FACTORIES[name](window_size)
