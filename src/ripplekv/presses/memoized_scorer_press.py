"""A scorer whose scores go through the record's memo, for presses that call their scorer's ``score`` themselves.

kvpress's :class:`~kvpress.AdaKVPress` calls ``self.press.score(...)``; around a scorer, this gives it the scores
:func:`~ripplekv.presses.score_memo.token_scores` computes once per layer and record, shared with every schedule over
the same scorer. AdaKV writes into the scores it is given (its safeguard ``scatter_``), so each call returns a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress, SnapKVPress
from torch import nn

from ripplekv.presses.layer_budget_press import scorer_at_ratio
from ripplekv.presses.score_memo import token_scores

__all__ = ["MemoizedScorerPress"]


@dataclass
class MemoizedScorerPress(ScorerPress):
    """``press``'s scores through the active score memo, returned as a copy.

    Args:
        press: the token scorer; it scores at this press's ``compression_ratio``, which the wrapping press sets.
    """

    press: ScorerPress = field(default_factory=SnapKVPress)
    compression_ratio: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.press, ScorerPress):
            raise TypeError(f"MemoizedScorerPress needs a kvpress ScorerPress, got {type(self.press).__name__}")

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
        return token_scores(scorer, module, hidden_states, keys, values, attentions, kwargs).clone()
