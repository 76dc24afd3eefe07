"""LayerBudgetAdaPress: per-layer budgets from a schedule, AdaKV's head-wise allocation inside each layer.

AdaKV (Feng et al., 2024, arXiv:2407.11550) chooses a layer's ``B * H`` (head, token) entries by score across its
``H`` KV heads jointly, so concentrated heads give entries to spread ones. With
:class:`~ripplekv.allocation.UniformSchedule` this keeps exactly what kvpress's ``AdaKVPress`` keeps; with
:class:`~ripplekv.allocation.ProfileSchedule` it is ``ripplekv-ada``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from ripplekv.allocation.budget import ProfileSchedule
from ripplekv.models.cache import dynamic_layer
from ripplekv.presses.layer_budget_press import LayerBudgetPress
from ripplekv.profiling.profile import AppliedSetting, SensitivityProfile
from ripplekv.validation import is_real

__all__ = ["DEFAULT_ALPHA_SAFEGUARD", "LayerBudgetAdaPress", "headwise_keep_mask", "safeguard_tokens"]

DEFAULT_ALPHA_SAFEGUARD = 0.2
"""kvpress's default ``alpha_safeguard`` (AdaKV's paper uses 0.2 as well)."""


def safeguard_tokens(n_kept: int, alpha: float) -> int:
    """Tokens every head keeps whatever its scores: ``int(n_kept * alpha)`` of the layer's average ``n_kept``, at
    least 1 when ``alpha > 0``."""
    n_safe = int(n_kept * alpha)
    return max(1, n_safe) if alpha > 0 and n_kept > 0 else n_safe


def headwise_keep_mask(scores: torch.Tensor, n_kept: int, n_safe: int) -> torch.Tensor:
    """AdaKV's allocation of one layer, the boolean ``(batch, kv_heads, tokens)`` mask of kept entries: each head's
    ``n_safe`` best tokens, and the rest of the ``n_kept * heads`` entries per row by score across all heads."""
    if scores.dim() != 3:
        raise ValueError(f"scores must be (batch, kv_heads, tokens), got shape {tuple(scores.shape)}")
    batch, heads, tokens = scores.shape
    if not 0 <= n_kept <= tokens:
        raise ValueError(f"n_kept must be in [0, {tokens}], got {n_kept}")
    if not 0 <= n_safe <= n_kept:
        raise ValueError(f"n_safe must be in [0, n_kept={n_kept}], got {n_safe}")
    priority = scores.detach().to(torch.float64)  # a new tensor: the caller's scores are not written
    if n_safe:
        protected = priority.topk(n_safe, dim=-1).indices
        priority = priority.scatter(-1, protected, float("inf"))
    chosen = priority.reshape(batch, heads * tokens).topk(n_kept * heads, dim=-1).indices
    keep = torch.zeros(batch, heads * tokens, dtype=torch.bool, device=scores.device)
    keep.scatter_(-1, chosen, True)
    return keep.view(batch, heads, tokens)


@dataclass
class LayerBudgetAdaPress(LayerBudgetPress):
    """Per-layer budgets from a schedule (RippleKV), AdaKV's head-wise allocation within each layer.

    Layer ``l`` keeps ``n_l * kv_heads`` entries (``n_l``: :class:`~ripplekv.presses.LayerBudgetPress`'s count),
    chosen by :func:`headwise_keep_mask`; the dropped entries stay in memory, masked head by head in the cache layer,
    unless every head keeps ``n_l``. Not for eager attention nor padded batches.

    Args:
        alpha_safeguard: fraction in ``[0, 1]`` of a layer's per-head budget every head keeps (AdaKV's safeguard).
        evict_balanced: evict physically when every head of a layer keeps the same count; False always masks.
        profile: the profile a ``ProfileSchedule`` was allocated from, checked against the model when applied.
        strict_profile: a profile of other weights than the model's raises instead of warning once.
        setting: the RippleKV ``r`` and ``gamma`` of the ``ProfileSchedule`` and their origin (rows record it).
    """

    alpha_safeguard: float = DEFAULT_ALPHA_SAFEGUARD
    evict_balanced: bool = True
    profile: SensitivityProfile | None = None
    strict_profile: bool = False
    setting: AppliedSetting | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_real(self.alpha_safeguard):
            raise TypeError(f"alpha_safeguard must be a real number, got {type(self.alpha_safeguard).__name__}")
        if not 0 <= float(self.alpha_safeguard) <= 1:
            raise ValueError(f"alpha_safeguard must be in [0, 1], got {self.alpha_safeguard!r}")
        if not isinstance(self.evict_balanced, bool):
            raise TypeError(f"evict_balanced must be a bool, got {type(self.evict_balanced).__name__}")
        if self.profile is not None:
            if not isinstance(self.profile, SensitivityProfile):
                raise TypeError(f"profile must be a SensitivityProfile or None, got {type(self.profile).__name__}")
            if not isinstance(self.schedule, ProfileSchedule):
                raise ValueError("a profile is given but the schedule is not a ProfileSchedule allocated from it")
            if len(self.schedule.scores) != self.profile.num_layers:
                raise ValueError(
                    f"the schedule has {len(self.schedule.scores)} layer scores, the profile {self.profile.num_layers}"
                )

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Check the profile against the model, then :class:`~ripplekv.presses.LayerBudgetPress`'s binding."""
        if self.profile is not None:
            self.profile.check_model(model, strict=self.strict_profile)
        super().post_init_from_model(model)

    def _needs_varlen(self, model: PreTrainedModel) -> bool:
        return True  # the cache layers' head-wise masks are read by ripplekv's attention (enabling is idempotent)

    def select(
        self,
        module: nn.Module,
        keys: torch.Tensor,
        values: torch.Tensor,
        scores: torch.Tensor,
        n_kept: int,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the layer's budget head-wise: evict the dropped entries when every head keeps the same count, else
        replace the pass's cache layer by a :class:`~ripplekv.models.headwise.MaskedLayer` hiding them."""
        k_len = keys.shape[2]
        keep = headwise_keep_mask(scores, n_kept, safeguard_tokens(n_kept, float(self.alpha_safeguard)))
        if self.evict_balanced and bool((keep.sum(-1) == n_kept).all()):
            positions = torch.arange(k_len, device=keep.device).expand_as(keep)
            kept = torch.where(keep, positions, k_len).sort(dim=-1).values[..., :n_kept]
            index = kept.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
            return keys.gather(2, index).contiguous(), values.gather(2, index).contiguous()
        if "eager" in str(module.config._attn_implementation):
            raise ValueError(
                f"{type(self).__name__} masks keys head-wise, which needs a boolean attention mask: load the model "
                "with attn_implementation='sdpa', not eager"
            )
        cache = kwargs["past_key_values"]
        cache.layers[module.layer_idx] = dynamic_layer(keys, values, (~keep).nonzero(as_tuple=True))
        return keys, values
