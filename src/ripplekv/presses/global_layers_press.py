"""GlobalLayersPress: any kvpress press, applied to a model's global layers only (sliding-window layers left whole)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers import PreTrainedModel

from ripplekv.models.layer_types import compressed_layers
from ripplekv.presses.scorers import check_attention_weights

__all__ = ["GlobalLayersPress"]


@dataclass
class GlobalLayersPress(BasePress):
    """Compress the global layers with ``press``; leave sliding-window layers (Gemma 3's local ones) whole.

    kvpress 0.5.5 skips the sliding layers of ``Gemma3ForConditionalGeneration`` only, and a compressed sliding layer
    no longer holds the window the model attends to. Without sliding layers it compresses exactly what ``press``
    does.
    """

    press: BasePress

    def __post_init__(self) -> None:
        if not isinstance(self.press, BasePress):
            raise TypeError(f"{type(self).__name__} wraps a kvpress press, got {type(self.press).__name__}")

    @property
    def compression_ratio(self) -> float:
        """The wrapped press's compression ratio (of the global layers)."""
        return float(getattr(self.press, "compression_ratio", 0.0))

    def post_init_from_model(self, model: PreTrainedModel) -> None:
        """Check that the model has a global layer and returns the attention weights the press reads, then
        initialise the wrapped press."""
        compressed_layers(model.config)
        check_attention_weights(self.press, model)
        self.press.post_init_from_model(model)

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``press.compress`` on a global layer; a sliding-window layer's keys and values as they are."""
        if module.layer_idx not in compressed_layers(module.config):
            return keys, values
        return self.press.compress(module, hidden_states, keys, values, attentions, kwargs)
