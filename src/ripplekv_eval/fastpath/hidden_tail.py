"""What a press reads of the prompt's hidden states (so a prefill record keeps no more than that ``hidden_tail``),
and which presses the fast path derives at all (exact classes; any other runs its own prefill). A scorer reading every
position (ExpectedAttention) reads none where the record prescores it, its scores computed while the prefill runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Any

from kvpress import (
    AdaKVPress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    PyramidKVPress,
    QFilterPress,
    RandomPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.presses.base_press import BasePress
from kvpress.presses.scorer_press import ScorerPress

from ripplekv.presses.full_press import FullPress
from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.lava_press import LavaPress
from ripplekv.presses.lava_scorer import LavaScorerPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.registry import DEFAULT_WINDOW
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv_eval.fastpath.score_memo import MEMO_SCORING, scorer_key

DEFAULT_HIDDEN_TAIL = DEFAULT_WINDOW + 1  # what SnapKV reads at make_press's default window


def _snapkv_tail(press: Any) -> int:
    # score() reads hidden_states[:, -window_size:] (and position_embeddings cut the same way) and checks
    # hidden_states.shape[1] > window_size
    return int(press.window_size) + 1


# What the score (or compress) of these exact classes reads of the hidden states: the last n positions, or None
# for all of them. A subclass is not matched: it may read more.
_SCORER_TAILS: dict[type, Callable[[Any], int | None]] = {
    SnapKVPress: _snapkv_tail,
    PyramidKVPress: _snapkv_tail,  # SnapKV's score, its own per-layer counts
    TOVAPress: lambda press: 1,  # the last query's attention (compute_window_attention with a window of 1)
    KnormPress: lambda press: 0,  # keys only
    KeyDiffPress: lambda press: 0,
    StreamingLLMPress: lambda press: 0,  # positions only
    QFilterPress: lambda press: 0,
    RandomPress: lambda press: 0,
    ExpectedAttentionPress: lambda press: None,  # query mean and covariance over every position after the sinks
    FullPress: lambda press: 0,
    LavaScorerPress: _snapkv_tail,  # SnapKV's window attention, pooled
}
# Presses whose compress reads the hidden states only through their wrapped ``press``'s score.
_WRAPPERS: tuple[type, ...] = (
    AdaKVPress,
    GlobalLayersPress,
    LayerBudgetPress,
    LayerBudgetAdaPress,
    RippleKVPress,
)

# Per-prompt presses: derived every layer at once (:mod:`ripplekv_eval.fastpath.derive`).
PER_PROMPT: tuple[type[PerPromptBudgetPress], ...] = (PerPromptBudgetPress, LavaPress)
# Scorers that read every prompt position, which a record can score while the prefill runs instead.
PRESCORABLE: frozenset[type[ScorerPress]] = frozenset({ExpectedAttentionPress})


def _prescored(scorer: BasePress, prescored: Collection[Hashable]) -> bool:
    return type(scorer) in PRESCORABLE and scorer_key(scorer) in prescored  # type: ignore[arg-type]


def hidden_states_needed(press: BasePress, prescored: Collection[Hashable] = frozenset()) -> int | None:
    """How many trailing prompt positions of each layer's input hidden states ``press.compress`` reads (None: all).

    ``prescored``: the :func:`~ripplekv_eval.fastpath.score_memo.scorer_key` of the scorers a record prescored, which
    read none under a press scoring through the record's memo.
    """
    kind = type(press)
    if kind in MEMO_SCORING and _prescored(press.press, prescored):
        return 0
    if kind in _WRAPPERS:
        return hidden_states_needed(press.press, prescored)
    if kind in PER_PROMPT:  # its scorer's, and its window's statistics
        inner = 0 if _prescored(press.press, prescored) else hidden_states_needed(press.press)
        return None if inner is None else max(inner, int(press.statistic_window) + 1)  # type: ignore[arg-type]
    rule = _SCORER_TAILS.get(kind)
    return None if rule is None else rule(press)


def is_derivable(press: BasePress) -> bool:
    """Whether the fast path derives ``press``'s cache: it and every press it wraps are of the exact classes above
    (a subclass may read or do more than its base)."""
    kind = type(press)
    if kind in _WRAPPERS or kind in PER_PROMPT:
        return is_derivable(press.press)
    return kind in _SCORER_TAILS


def hidden_states_tail(presses: Iterable[BasePress], prescore: Iterable[ScorerPress] = ()) -> int | None:
    """The ``hidden_tail`` a record needs to derive every one of ``presses`` (None: all), given the scorers it
    will ``prescore``."""
    prescored = frozenset(scorer_key(s) for s in prescore)
    most = 0
    for press in presses:
        need = hidden_states_needed(press, prescored)
        if need is None:
            return None
        most = max(most, need)
    return most


def prescored_scorers(presses: Iterable[BasePress]) -> tuple[ScorerPress, ...]:
    """The scorers of ``presses`` a record should prescore: those of :data:`PRESCORABLE` a press scores through the
    record's memo, one per :func:`~ripplekv_eval.fastpath.score_memo.scorer_key`."""
    found: dict[Hashable, ScorerPress] = {}

    def visit(press: BasePress) -> None:
        kind = type(press)
        memo_scored = kind in MEMO_SCORING or kind in PER_PROMPT
        inner = getattr(press, "press", None)
        if memo_scored and type(inner) in PRESCORABLE:
            found.setdefault(scorer_key(inner), inner)  # type: ignore[arg-type]
        elif kind in _WRAPPERS and inner is not None:
            visit(inner)

    for press in presses:
        visit(press)
    return tuple(found.values())
