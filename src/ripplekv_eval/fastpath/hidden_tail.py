"""What a press reads of the prompt's hidden states, so a prefill record keeps that and no more; which presses the
fast path derives at all.

A prefill record (:mod:`ripplekv_eval.fastpath.record`) keeps, per layer, the *last* ``hidden_tail`` input hidden
states, not the whole prompt's (``n_tokens * n_layers * hidden_size`` elements, more than the cache itself on small
models). What a press reads of them is read from its code (:func:`hidden_states_needed`): SnapKV and the presses
built on its scorer (PyramidKV, AdaKV, RippleKV) read the last ``window_size`` positions and check the query length
exceeds the window, so they need ``window_size + 1``; TOVA the last position; KNorm, KeyDiff, StreamingLLM, QFilter,
Random and the full cache none; ExpectedAttention (query statistics over the prompt) all of them.
:func:`hidden_states_tail` takes the most that a run's presses need, for the caller to pass to
:func:`~ripplekv_eval.fastpath.record.record_prefill` (whose default keeps :data:`DEFAULT_HIDDEN_TAIL`, what SnapKV
reads at the default window); deriving a press that needs more than a record holds raises
:class:`~ripplekv_eval.fastpath.derive.NotDerivableError`. The tables are also the one rule of what the fast path
derives (:func:`is_derivable`, exact classes): any other press runs its own prefill.

Prescoring: ExpectedAttention would make a record keep every layer's whole hidden states (32 GiB at 128K tokens on
Llama-3.1-8B in bf16). A record made with ``prescore`` (:func:`prescored_scorers` of the presses) computes its scores
while the prefill runs instead and pins them in the record's memo (one ``(batch, kv_heads, tokens)`` tensor per
layer): in one pass by kvpress's own ``score`` on the layer's whole input, so every derived cache is bit for bit
the one a record of every hidden state gives; in a chunked prefill from the query moments each chunk adds to
(:mod:`ripplekv_eval.fastpath.query_moments`), equal to it up to the rounding of the model's dtype (tested: the same
kept tokens). The presses whose scorer the fast path hands the memo
(:data:`~ripplekv_eval.fastpath.score_memo.MEMO_SCORING`: the schedules, AdaKV) and the per-prompt presses then need
none of the hidden states for it; a pinned score asked for other key tensors raises instead of being recomputed.
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

__all__ = [
    "DEFAULT_HIDDEN_TAIL",
    "PER_PROMPT",
    "PRESCORABLE",
    "hidden_states_needed",
    "hidden_states_tail",
    "is_derivable",
    "prescored_scorers",
]

DEFAULT_HIDDEN_TAIL = DEFAULT_WINDOW + 1
"""Trailing hidden-state positions a record keeps unless told otherwise (65): what SnapKV and the presses on its
scorer read at :func:`~ripplekv.presses.make_press`'s default window (``window_size + 1``)."""


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

PER_PROMPT: tuple[type[PerPromptBudgetPress], ...] = (PerPromptBudgetPress, LavaPress)
"""Per-prompt presses (exact classes): derived every layer at once (:mod:`ripplekv_eval.fastpath.per_prompt`), their
scorer and window statistics through the record's memo."""

PRESCORABLE: frozenset[type[ScorerPress]] = frozenset({ExpectedAttentionPress})
"""Scorers (exact types) whose scores read every prompt position's hidden states, which a record can compute while the
prefill runs instead of keeping those hidden states (:func:`~ripplekv_eval.fastpath.record.record_prefill`'s
``prescore``)."""


def _prescored(scorer: BasePress, prescored: Collection[Hashable]) -> bool:
    return type(scorer) in PRESCORABLE and scorer_key(scorer) in prescored  # type: ignore[arg-type]


def hidden_states_needed(press: BasePress, prescored: Collection[Hashable] = frozenset()) -> int | None:
    """How many of the last prompt positions of each layer's input hidden states ``press.compress`` reads.

    kvpress's scorers and RippleKV's presses as read from their code (see the module docstring; wrappers answer for
    their wrapped scorer); any other press reads them all. A scorer whose scores the record computed while it ran
    (``prescored``) reads none under a press the fast path hands the record's memo (:data:`MEMO_SCORING`,
    :data:`PER_PROMPT`).

    Args:
        press: a press.
        prescored: :func:`~ripplekv_eval.fastpath.score_memo.scorer_key` of the scorers a record prescored
            (:attr:`PrefillRecord.prescored`).

    Returns:
        The number of trailing positions (0: none), or None for the whole prompt.
    """
    kind = type(press)
    if kind in MEMO_SCORING and _prescored(press.press, prescored):
        return 0
    if kind in _WRAPPERS:
        return hidden_states_needed(press.press, prescored)
    if kind in PER_PROMPT:  # its scorer's, and its window's statistics
        inner = 0 if _prescored(press.press, prescored) else hidden_states_needed(press.press)
        return None if inner is None else max(inner, int(press.window) + 1)
    rule = _SCORER_TAILS.get(kind)
    return None if rule is None else rule(press)


def is_derivable(press: BasePress) -> bool:
    """Whether the shared-prefill fast path derives ``press``'s cache from a record: the press and every press it
    wraps are of the exact classes its tables were read from (above), whose derived caches are their own prefill's
    (tested). The one rule every caller follows; any other press runs its own prefill.

    A subclass is not derivable, whatever it inherits: its ``score`` or hook may read or do more than its base
    class's.

    Args:
        press: a press.
    """
    kind = type(press)
    if kind in _WRAPPERS or kind in PER_PROMPT:
        return is_derivable(press.press)
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
    through the record's memo, one per :func:`~ripplekv_eval.fastpath.score_memo.scorer_key`.

    Args:
        presses: the presses that will be derived from the record.
    """
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
