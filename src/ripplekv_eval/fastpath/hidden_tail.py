"""What a press reads of the prompt's hidden states, so a prefill record keeps that and no more.

A prefill record (:mod:`ripplekv_eval.fastpath.record`) keeps, per layer, the *last* ``hidden_tail`` input hidden
states, not the whole prompt's (``n_tokens * n_layers * hidden_size`` elements, more than the cache itself on small
models). What a press reads of them is declared (:func:`hidden_states_needed`): SnapKV and the presses built on its
scorer (PyramidKV, AdaKV, RippleKV) read the last ``window_size`` positions and check the query length exceeds the
window, so they need ``window_size + 1``; TOVA the last position; KNorm, KeyDiff, StreamingLLM, QFilter, Random and
the full cache none; ExpectedAttention (query statistics over the prompt) and any press not declared all of them.
:func:`hidden_states_tail` takes the most that a run's presses need, for the caller to pass to
:func:`~ripplekv_eval.fastpath.record.record_prefill`
(whose default keeps :data:`DEFAULT_HIDDEN_TAIL`, what SnapKV reads
at the default window); deriving a press that needs more than a record holds raises
:class:`~ripplekv_eval.fastpath.derive.NotDerivableError`. The tables are also what the fast path knows
(:func:`knows`, exact classes): an evaluation derives only those presses and runs any other by its own prefill.

Prescoring: ExpectedAttention would make a record keep every layer's whole hidden states (32 GiB at 128K tokens on
Llama-3.1-8B in bf16). A record made with ``prescore`` (:func:`prescored_scorers` of the presses) computes its scores
while the prefill runs instead and pins them in the record's memo (one ``(batch, kv_heads, tokens)`` tensor per
layer): in one pass by kvpress's own ``score`` on the layer's whole input, so every derived cache is bit for bit
the one a record of every hidden state gives; in a chunked prefill from the query moments each chunk adds to
(:mod:`ripplekv_eval.fastpath.query_moments`), equal to it up to the rounding of the model's dtype (tested: the same
kept tokens). The presses that score through the memo (the schedules, the per-prompt presses, and ``make_press``'s
AdaKV, whose scorer is a :class:`~ripplekv.presses.memoized_scorer_press.MemoizedScorerPress`) then need none of
the hidden states for it; a kvpress AdaKV built around a bare scorer calls it itself and still needs them all, and a
pinned score asked for other key tensors raises instead of being recomputed from the tail.
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
from ripplekv.presses.memoized_scorer_press import MemoizedScorerPress
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.registry import DEFAULT_WINDOW
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.presses.score_memo import scorer_key

__all__ = [
    "DEFAULT_HIDDEN_TAIL",
    "HIDDEN_STATES_ATTRIBUTE",
    "PRESCORABLE",
    "hidden_states_needed",
    "hidden_states_tail",
    "knows",
    "prescored_scorers",
]

DEFAULT_HIDDEN_TAIL = DEFAULT_WINDOW + 1
"""Trailing hidden-state positions a record keeps unless told otherwise (65): what SnapKV and the presses on its
scorer read at :func:`~ripplekv.presses.make_press`'s default window (``window_size + 1``)."""

HIDDEN_STATES_ATTRIBUTE = "hidden_states_tail"
"""A press may declare, as this attribute (or property), how many of the last prompt positions of the hidden
states its ``compress`` reads: an int >= 0, or None for all of them. It overrides :func:`hidden_states_needed`'s
table, and a subclass of a listed press that reads more must declare it."""

_UNDECLARED = object()


def _snapkv_tail(press: Any) -> int:
    # score() reads hidden_states[:, -window_size:] (and position_embeddings cut the same way) and checks
    # hidden_states.shape[1] > window_size
    return int(press.window_size) + 1


# What the score (or compress) of these exact classes reads of the hidden states: the last n positions, or None
# for all of them. A subclass is not matched: it may read more, and declares HIDDEN_STATES_ATTRIBUTE instead.
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
    MemoizedScorerPress,
    RippleKVPress,
)
# Wrappers that score through ``token_scores`` (the record's memo, where prescored scores are found); kvpress's AdaKV
# calls its scorer's ``score`` itself (through the memo when that scorer is a MemoizedScorerPress, as make_press
# builds it), and GlobalLayersPress hands the layer to its press.
_MEMO_SCORING: tuple[type, ...] = (LayerBudgetPress, LayerBudgetAdaPress, MemoizedScorerPress, RippleKVPress)

# Presses that derive every layer at once from a record (``derive``), scoring through their wrapped ``press``.
_PER_PROMPT: tuple[type, ...] = (PerPromptBudgetPress, LavaPress)

PRESCORABLE: frozenset[type[ScorerPress]] = frozenset({ExpectedAttentionPress})
"""Scorers (exact types) whose scores read every prompt position's hidden states, which a record can compute while the
prefill runs instead of keeping those hidden states (:func:`~ripplekv_eval.fastpath.record.record_prefill`'s
``prescore``)."""


def _prescored(scorer: BasePress, prescored: Collection[Hashable]) -> bool:
    return type(scorer) in PRESCORABLE and scorer_key(scorer) in prescored  # type: ignore[arg-type]


def hidden_states_needed(press: BasePress, prescored: Collection[Hashable] = frozenset()) -> int | None:
    """How many of the last prompt positions of each layer's input hidden states ``press.compress`` reads.

    A press's own declaration (:data:`HIDDEN_STATES_ATTRIBUTE`) comes first; then kvpress's scorers and RippleKV's
    presses as read from their code (see the module docstring; wrappers answer for their wrapped scorer); any
    other press reads them all. A scorer whose scores the record computed while it ran (``prescored``) reads none
    when its wrapper scores through the record's memo (RippleKV's schedules and per-prompt presses, not AdaKV).

    Args:
        press: a press.
        prescored: :func:`~ripplekv.presses.score_memo.scorer_key` of the scorers a record prescored
            (:attr:`PrefillRecord.prescored`).

    Returns:
        The number of trailing positions (0: none), or None for the whole prompt.
    """
    declared = getattr(press, HIDDEN_STATES_ATTRIBUTE, _UNDECLARED)
    if declared is not _UNDECLARED:
        if declared is not None and (isinstance(declared, bool) or not isinstance(declared, int) or declared < 0):
            raise ValueError(
                f"{type(press).__name__}.{HIDDEN_STATES_ATTRIBUTE} must be an int >= 0 or None, got {declared!r}"
            )
        return declared
    kind = type(press)
    if kind in _MEMO_SCORING and _prescored(press.press, prescored):
        return 0
    if kind in _WRAPPERS:
        return hidden_states_needed(press.press, prescored)  # AdaKV's scorer answers for itself: all positions
    if getattr(press, "derives_all_layers", False):  # a per-prompt press: its scorer's, and its window's statistics
        inner = 0 if _prescored(press.press, prescored) else hidden_states_needed(press.press)
        return None if inner is None else max(inner, int(press.window) + 1)
    rule = _SCORER_TAILS.get(kind)
    return None if rule is None else rule(press)


def knows(press: BasePress) -> bool:
    """Whether the shared-prefill fast path knows ``press``: the press and every press it wraps are of the exact
    classes its tables were read from (above), whose caches derived from a record are their own prefill's (tested).

    A subclass is not known, whatever it inherits: its ``score`` or hook may read or do more than its base class's.
    An evaluation runs a press the fast path does not know by its own prefill (:mod:`ripplekv_eval.running.rows`).

    Args:
        press: a press.
    """
    kind = type(press)
    if kind in _WRAPPERS or kind in _PER_PROMPT:
        return knows(press.press)
    return kind in _SCORER_TAILS


def hidden_states_tail(presses: Iterable[BasePress], prescore: Iterable[ScorerPress] = ()) -> int | None:
    """The ``hidden_tail`` a record needs to derive every one of ``presses``: the most any needs, None for all.

    Args:
        presses: the presses that will be derived from the record.
        prescore: the scorers the record will prescore (:func:`prescored_scorers`, passed to
            :func:`~ripplekv_eval.fastpath.record.record_prefill`): their presses need none of the hidden states.
    """
    prescored = frozenset(scorer_key(s) for s in prescore)
    most = 0
    for press in presses:
        need = hidden_states_needed(press, prescored)
        if need is None:
            return None
        most = max(most, need)
    return most


def prescored_scorers(presses: Iterable[BasePress]) -> tuple[ScorerPress, ...]:
    """The scorers of ``presses`` a record should prescore: those of :data:`PRESCORABLE` that a press scores
    through the record's memo, one per :func:`~ripplekv.presses.score_memo.scorer_key`.

    Args:
        presses: the presses that will be derived from the record.
    """
    found: dict[Hashable, ScorerPress] = {}

    def visit(press: BasePress) -> None:
        if getattr(press, HIDDEN_STATES_ATTRIBUTE, _UNDECLARED) is not _UNDECLARED:
            return
        kind = type(press)
        memo_scored = kind in _MEMO_SCORING or getattr(press, "derives_all_layers", False)
        inner = getattr(press, "press", None)
        if memo_scored and type(inner) in PRESCORABLE:
            found.setdefault(scorer_key(inner), inner)  # type: ignore[arg-type]
        elif kind in _WRAPPERS and inner is not None:
            visit(inner)

    for press in presses:
        visit(press)
    return tuple(found.values())
