"""A memo of token scores and per-layer statistics while many presses are derived from one prefill record.

The schedules of one scorer differ in how many tokens each layer keeps, not in how tokens are ranked, and
recomputing the scores was most of a derivation's time (:mod:`ripplekv_eval.fastpath`). While a :class:`ScoreMemo`
is active (:func:`memoized`), :func:`token_scores` computes a layer's scores once per scorer and
:func:`layer_statistic` a rule's statistic once per rule. Exact: an entry is reused only for the very key tensor it
was computed from (by identity), and only for scorers of :data:`RATIO_FREE` (by exact type), returning the tensor
computed the first time. Memory: one ``(batch, kv_heads, tokens)`` tensor per layer and scorer.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import fields, is_dataclass
from typing import Any

import torch
from kvpress import (
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    ObservedAttentionPress,
    ScorerPress,
    SnapKVPress,
    TOVAPress,
)
from torch import nn

from ripplekv.presses.lava_scorer import LavaScorerPress

__all__ = [
    "NEEDS_ATTENTION_WEIGHTS",
    "RATIO_FREE",
    "ScoreMemo",
    "layer_statistic",
    "memoized",
    "scorer_key",
    "token_scores",
]

RATIO_FREE: frozenset[type[ScorerPress]] = frozenset(
    {SnapKVPress, ExpectedAttentionPress, TOVAPress, KnormPress, KeyDiffPress, LavaScorerPress}
)
"""Scorers whose ``score()`` reads neither their compression ratio nor any state it changes (kvpress 0.5.5, and
LAVa's token score)."""

NEEDS_ATTENTION_WEIGHTS: frozenset[type[ScorerPress]] = frozenset({ObservedAttentionPress})
"""Scorers that score from the attention weights, which only eager attention returns (kvpress 0.5.5)."""


class ScoreMemo:
    """Results computed once per (kind, key, layer), tied to the key tensor they were computed from.

    :meth:`pin`'s entries (scores a prefill record computed while it ran, which later would need what the record
    does not keep) are never recomputed: reading one over another key tensor raises, and :meth:`clear` keeps them.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, Hashable, int], tuple[torch.Tensor, Any]] = {}
        self._pinned: dict[tuple[str, Hashable, int], tuple[torch.Tensor, Any]] = {}
        self._pinned_keys: set[tuple[str, Hashable]] = set()
        self.hits = 0
        self.misses = 0

    def get(self, kind: str, key: Hashable, layer: int, keys: torch.Tensor, compute: Callable[[], Any]) -> Any:
        """The memoised ``compute()`` for ``(kind, key, layer)``; an entry made from other ``keys`` is recomputed.

        ``kind`` is ``"scores"`` or ``"statistic"``; ``key`` what computes it (:func:`scorer_key`, a rule and window).

        Raises:
            ValueError: for a pinned ``(kind, key)`` without an entry of this layer over this very ``keys``.
        """
        if (kind, key) in self._pinned_keys:
            pinned = self._pinned.get((kind, key, layer))
            if pinned is None or pinned[0] is not keys:
                raise ValueError(
                    f"the prefill record computed the {kind} of {_describe(key)} while it ran, for its own keys of "
                    f"layer {layer}; they were asked for other keys (a press that changes the keys before scoring "
                    "cannot be derived from it)"
                )
            self.hits += 1
            return pinned[1]
        entry = self._entries.get((kind, key, layer))
        if entry is not None and entry[0] is keys:
            self.hits += 1
            return entry[1]
        self.misses += 1
        result = compute()
        self._entries[kind, key, layer] = (keys, result)
        return result

    def pin(self, kind: str, key: Hashable, layer: int, keys: torch.Tensor, result: Any) -> None:
        """Hold ``result`` for ``(kind, key, layer)`` over ``keys`` for good: a record's ``prescore`` scores."""
        self._pinned_keys.add((kind, key))
        self._pinned[kind, key, layer] = (keys, result)

    def pinned_tensors(self) -> list[torch.Tensor]:
        """The tensors of the pinned results (what a record holds besides its layers)."""
        return [result for _, result in self._pinned.values() if isinstance(result, torch.Tensor)]

    def clear(self) -> None:
        """Drop every computed entry (and the key tensors it pinned); pinned results stay."""
        self._entries.clear()


def _describe(key: Hashable) -> str:
    """A scorer key's class name (the key itself otherwise)."""
    if isinstance(key, tuple) and key and isinstance(key[0], type):
        return key[0].__name__
    return repr(key)


_ACTIVE: ContextVar[ScoreMemo | None] = ContextVar("ripplekv_score_memo", default=None)


@contextmanager
def memoized(memo: ScoreMemo) -> Iterator[ScoreMemo]:
    """Use ``memo`` (one per prefill record) for :func:`token_scores` and :func:`layer_statistic` within the block."""
    token = _ACTIVE.set(memo)
    try:
        yield memo
    finally:
        _ACTIVE.reset(token)


def scorer_key(scorer: ScorerPress) -> Hashable | None:
    """What identifies a scorer's scores: its exact type and fields but the compression ratio; None (never
    memoised) outside :data:`RATIO_FREE`."""
    if type(scorer) not in RATIO_FREE or not is_dataclass(scorer):
        return None
    values = tuple((f.name, getattr(scorer, f.name)) for f in fields(scorer) if f.name != "compression_ratio")
    try:
        hash(values)
    except TypeError:
        return None
    return (type(scorer), values)


def token_scores(
    scorer: ScorerPress,
    module: nn.Module,
    hidden_states: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attentions: torch.Tensor | None,
    kwargs: dict,
) -> torch.Tensor:
    """``scorer.score(...)`` of one layer, computed once per scorer while a memo is active.

    Raises:
        ValueError: for a scorer of :data:`NEEDS_ATTENTION_WEIGHTS` without attention weights (the model does not
            run eager attention).
    """
    if attentions is None and type(scorer) in NEEDS_ATTENTION_WEIGHTS:
        raise ValueError(
            f"{type(scorer).__name__} scores tokens from the attention weights, which this model's attention "
            f"implementation does not return: load the model with attn_implementation='eager'"
        )
    memo = _ACTIVE.get()
    key = None if memo is None else scorer_key(scorer)
    if memo is None or key is None:
        return scorer.score(module, hidden_states, keys, values, attentions, kwargs)
    compute = lambda: scorer.score(module, hidden_states, keys, values, attentions, kwargs)  # noqa: E731
    return memo.get("scores", key, int(module.layer_idx), keys, compute)


def layer_statistic(key: Hashable, module: nn.Module, keys: torch.Tensor, compute: Callable[[], Any]) -> Any:
    """A per-prompt rule's statistic of one layer, computed once per ``key`` (the rule and its window) and ``keys``."""
    memo = _ACTIVE.get()
    if memo is None:
        return compute()
    return memo.get("statistic", key, int(module.layer_idx), keys, compute)
