"""LavaPress: LAVa complete (Shen et al., 2025, arXiv:2509.09754), its per-prompt layer budgets and its head-wise split.

Layer budgets as ``lava-layer``'s; inside layer ``l`` each KV head keeps the scorer's window plus its share of
``H * (B_l - w)`` prefix tokens (:func:`~ripplekv.allocation.lava_heads.lava_head_budgets`). Every head keeps its
``max_h k_h`` best tokens in memory and the surplus is masked in the cache layer; a layer whose heads all keep
``B_l`` is evicted with no mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress
from transformers import PretrainedConfig
from transformers.cache_utils import DynamicLayer

from ripplekv.allocation.lava import LavaRule
from ripplekv.allocation.lava_heads import DEFAULT_FLOOR_ALPHA, lava_head_budgets
from ripplekv.allocation.per_prompt import PerPromptSchedule
from ripplekv.models.cache import dynamic_layer
from ripplekv.presses.lava_scorer import LavaScorerPress
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress, select_top
from ripplekv.validation import is_real

__all__ = ["DEFAULT_LAVA_BUDGET", "LavaPress", "Masked", "headwise_select"]

DEFAULT_LAVA_BUDGET = 0.2
"""The kept fraction of a :class:`LavaPress` built without a schedule."""

Masked = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""kvpress's ``masked_key_indices``: ``(batch, kv_head, position)`` index tensors of the masked entries."""


def headwise_select(
    keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor, counts: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, torch.Tensor, Masked | None]:
    """Keep ``counts[b][h]`` highest-scored tokens in KV head ``h`` of batch row ``b``: every head keeps its
    ``max(counts)`` best tokens, and the entries past its count are returned as masked indices into the kept layer
    (None when every head keeps the largest count)."""
    batch, heads, tokens = scores.shape
    if len(counts) != batch or any(len(row) != heads for row in counts):
        raise ValueError(f"counts must be {batch} rows of {heads} head counts, got {counts!r}")
    if any(not 0 <= int(c) <= tokens for row in counts for c in row):
        raise ValueError(f"every count must be in [0, {tokens}], got {counts!r}")
    most = max(int(c) for row in counts for c in row)
    kept_keys, kept_values = select_top(keys, values, scores, most)
    if all(int(c) == most for row in counts for c in row):
        return kept_keys, kept_values, None
    ranking = scores.topk(tokens, dim=-1).indices if most >= tokens else None  # the layer is kept whole
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for b, row in enumerate(counts):
        for h, count in enumerate(row):
            if int(count) == most:
                continue
            if ranking is None:
                positions = torch.arange(int(count), most, device=scores.device)
            else:
                positions = ranking[b, h, int(count) :]
            fill = torch.full_like(positions, b), torch.full_like(positions, h)
            parts.append((fill[0], fill[1], positions))
    masked = tuple(torch.cat([part[i] for part in parts]) for i in range(3))
    return kept_keys, kept_values, masked  # type: ignore[return-value]


@dataclass
class LavaPress(PerPromptBudgetPress):
    """LAVa (Shen et al., 2025): per-prompt layer budgets, then a head-wise split of each layer.

    Args:
        press: the token scorer (default LAVa's own); it ranks tokens within each head and splits a layer's budget.
        schedule: default ``PerPromptSchedule(LavaRule(), 0.2)``; a rule that reads the residual stream is refused.
        floor_alpha: in ``[0, 1]`` (the authors' 0.2): every head keeps ``floor(floor_alpha * (B_l - w))`` prefix
            tokens at least.
    """

    press: ScorerPress = field(default_factory=LavaScorerPress)
    floor_alpha: float = DEFAULT_FLOOR_ALPHA

    def __post_init__(self) -> None:
        if self.schedule is None and isinstance(self.press, ScorerPress):
            self.schedule = PerPromptSchedule(LavaRule(), DEFAULT_LAVA_BUDGET, window_size=self.window_size)
        super().__post_init__()
        if not is_real(self.floor_alpha) or not 0 <= float(self.floor_alpha) <= 1:
            raise ValueError(f"floor_alpha must be a real number in [0, 1], got {self.floor_alpha!r}")
        if self.needs_residual:
            raise ValueError(
                f"LavaPress splits budgets of window-statistic rules; {self.schedule.rule.name} reads the residual "  # type: ignore[union-attr]
                "stream (use PerPromptBudgetPress)"
            )

    def head_counts(self, scores: torch.Tensor, budget: int) -> list[tuple[int, ...]]:
        """Tokens each KV head keeps (the reserved window included), per batch row, summing to
        ``kv_heads * min(budget, tokens)``; ``scores`` have the window last, as the scorer gives them."""
        batch, heads, tokens = scores.shape
        window = min(self.window_size, budget)
        if budget >= tokens or budget <= window:
            return [(min(budget, tokens),) * heads] * batch
        prefix = scores[..., : tokens - window].detach().to(torch.float64).cpu().numpy()
        split = [lava_head_budgets(row, budget - window, float(self.floor_alpha)) for row in prefix]
        return [tuple(window + count for count in row) for row in split]

    def prune(
        self, keys: torch.Tensor, values: torch.Tensor, scores: torch.Tensor, budget: int, config: PretrainedConfig
    ) -> DynamicLayer:
        """One layer's kept keys and values (memory at its largest head), masking the other heads' surplus."""
        kept_keys, kept_values, masked = headwise_select(keys, values, scores, self.head_counts(scores, budget))
        if masked is not None and "eager" in str(config._attn_implementation):
            raise ValueError(
                "LavaPress masks keys head-wise, which needs a boolean attention mask: load the model with "
                "attn_implementation='sdpa', not eager"
            )
        return dynamic_layer(kept_keys, kept_values, masked)
