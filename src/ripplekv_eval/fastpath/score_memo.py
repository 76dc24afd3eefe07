"""A prefill record's memo of token scores and per-layer statistics, shared by every press derived from it: the
schedules of one scorer differ in how many tokens each layer keeps, not in how tokens are ranked."""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import torch
from kvpress import (
    AdaKVPress,
    ExpectedAttentionPress,
    KeyDiffPress,
    KnormPress,
    ScorerPress,
    SnapKVPress,
    TOVAPress,
)
from kvpress.presses.base_press import BasePress
from torch import nn

from ripplekv.presses.global_layers_press import GlobalLayersPress
from ripplekv.presses.lava_scorer import LavaScorerPress
from ripplekv.presses.layer_budget_ada_press import LayerBudgetAdaPress
from ripplekv.presses.layer_budget_press import LayerBudgetPress, scorer_at_ratio
from ripplekv.presses.ripplekv_press import RippleKVPress
from ripplekv.presses.selection_window import scorer_window

# Scorers whose score() reads neither their compression ratio nor any state it changes (kvpress 0.5.5, LAVa's).
RATIO_FREE: frozenset[type[ScorerPress]] = frozenset(
    {SnapKVPress, ExpectedAttentionPress, TOVAPress, KnormPress, KeyDiffPress, LavaScorerPress}
)
# Presses (exact classes) reading the hidden states only through press.score: handed a MemoizedScorerPress.
MEMO_SCORING: tuple[type[BasePress], ...] = (AdaKVPress, LayerBudgetAdaPress, LayerBudgetPress, RippleKVPress)


class ScoreMemo:
    """Results computed once per (kind, key, layer), tied to the key tensor they were computed from; :meth:`pin`'s
    entries (a record's prescored scores) are never recomputed: reading one over other keys raises."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, Hashable, int], tuple[torch.Tensor, Any]] = {}
        self._pinned: dict[tuple[str, Hashable, int], tuple[torch.Tensor, Any]] = {}
        self._pinned_keys: set[tuple[str, Hashable]] = set()
        self.hits = 0
        self.misses = 0

    def get(self, kind: str, key: Hashable, layer: int, keys: torch.Tensor, compute: Callable[[], Any]) -> Any:
        """The memoised ``compute()`` for ``(kind, key, layer)`` (``kind``: ``"scores"`` or ``"statistic"``); an entry
        made from other ``keys`` is recomputed, a pinned one raises ValueError."""
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

    def scores(
        self,
        scorer: ScorerPress,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> torch.Tensor:
        """``scorer.score(...)`` of one layer, computed once per :func:`scorer_key` (every time without one)."""
        key = scorer_key(scorer)
        compute = lambda: scorer.score(module, hidden_states, keys, values, attentions, kwargs)  # noqa: E731
        if key is None:
            return compute()
        return self.get("scores", key, int(module.layer_idx), keys, compute)


def _describe(key: Hashable) -> str:
    """A scorer key's class name (the key itself otherwise)."""
    if isinstance(key, tuple) and key and isinstance(key[0], type):
        return key[0].__name__
    return repr(key)


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


@dataclass
class MemoizedScorerPress(ScorerPress):
    """``press``'s scores (at this press's ``compression_ratio``) through ``memo``, returned as a copy (kvpress's
    AdaKV writes into the scores it is given)."""

    press: ScorerPress = field(default_factory=SnapKVPress)
    memo: ScoreMemo = field(default_factory=ScoreMemo, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"MemoizedScorerPress needs a kvpress ScorerPress, got {type(self.press).__name__}")

    @property
    def window_size(self) -> int:
        """The scorer's observation window (0 if it has none), which the budget presses read as their floor."""
        return scorer_window(self.press)

    def post_init_from_model(self, model: nn.Module) -> None:
        """The scorer's own initialisation (QFilter's filters, ...)."""
        self.press.post_init_from_model(model)

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> torch.Tensor:
        """A copy of ``press``'s ``(batch, kv_heads, tokens)`` scores at this press's ratio, memoised where exact."""
        scorer = scorer_at_ratio(self.press, self.compression_ratio)  # a copy: the caller's scorer is untouched
        return self.memo.scores(scorer, module, hidden_states, keys, values, attentions, kwargs).clone()


def memoizing(press: BasePress, memo: ScoreMemo) -> BasePress:
    """A copy of ``press`` whose scorer (a :data:`MEMO_SCORING` press's, also inside a ``GlobalLayersPress``) scores
    through ``memo``; any other press as it is. The caller's press is never modified."""
    kind = type(press)
    if kind is GlobalLayersPress:
        clone = copy.copy(press)
        clone.press = memoizing(press.press, memo)
        return clone
    if kind in MEMO_SCORING:
        clone = copy.copy(press)
        scorer = press.press  # type: ignore[attr-defined]
        ratio = float(getattr(scorer, "compression_ratio", 0.0))
        clone.press = MemoizedScorerPress(press=scorer, memo=memo, compression_ratio=ratio)  # type: ignore[attr-defined]
        return clone
    return press
