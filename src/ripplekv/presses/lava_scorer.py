"""LavaScorerPress: LAVa's token score (Shen et al., 2025, arXiv:2509.09754) as a kvpress ScorerPress.

The score is :func:`ripplekv.allocation.lava.lava_token_scores`, whose entropy is LAVa's layer statistic; the window
scores above every prefix token, so every head keeps it. Deviations: the run's shared window (64; the authors' 32),
float32 scores, and ``gqa_support=False`` refused on a grouped-query model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress import ScorerPress, SnapKVPress
from torch import nn
from torch.nn import functional as F

from ripplekv.allocation.lava import lava_token_scores
from ripplekv.allocation.per_prompt import check_pooling
from ripplekv.validation import is_integer, is_real

__all__ = ["LavaScorerPress"]


@dataclass
class LavaScorerPress(ScorerPress):
    """LAVa's token score: ``window_size`` the observation window (always kept), ``kernel_size`` the odd pooling
    width along the keys, ``gqa_support`` a max over the query heads of a KV head (False needs as many KV heads as
    query heads)."""

    compression_ratio: float = 0.0
    window_size: int = 64
    kernel_size: int = 7
    pooling: str = "maxpool"
    gqa_support: bool = True

    def __post_init__(self) -> None:
        if not is_real(self.compression_ratio) or not 0 <= float(self.compression_ratio) < 1:
            raise ValueError(f"compression_ratio must be in [0, 1), got {self.compression_ratio!r}")
        if not is_integer(self.window_size) or self.window_size < 1:
            raise ValueError(f"window_size must be an integer >= 1, got {self.window_size!r}")
        check_pooling("LavaScorerPress", self.kernel_size, self.pooling)
        if not isinstance(self.gqa_support, bool):
            raise ValueError(f"gqa_support must be a bool, got {self.gqa_support!r}")

    @property
    def hidden_states_tail(self) -> int:
        """Prompt positions of the hidden states ``score`` reads: the window's queries plus one, as SnapKV."""
        return int(self.window_size) + 1

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor | None,
        kwargs: dict,
    ) -> torch.Tensor:
        """LAVa's scores ``(batch, kv_heads, tokens)`` in float32, the window's above every prefix token's."""
        window = int(self.window_size)
        if hidden_states.shape[1] <= window or keys.shape[2] <= window:
            raise ValueError(
                f"the prompt has {keys.shape[2]} tokens, not more than LavaScorerPress's {window}-token window"
            )
        if attentions is not None:
            attention = attentions[..., -window:, :-window]
        else:
            attention = SnapKVPress.compute_window_attention(
                module, hidden_states, keys, window, kwargs["position_embeddings"]
            )
        scores = lava_token_scores(attention, values, self.kernel_size, self.pooling, self.gqa_support, torch.float32)
        if scores.shape[1] != keys.shape[1]:
            raise ValueError(
                f"gqa_support=False scores {scores.shape[1]} query heads, but the cache holds {keys.shape[1]} KV "
                "heads: LAVa without gqa_support keeps a cache per query head, which a kvpress cache cannot"
            )
        top = float(scores.max())
        return F.pad(scores, (0, window), value=2.0 * top + 1.0)  # scores are >= 0: strictly above every one
