"""FullPress: the uncompressed baseline as a press, so that every method is one name."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpress.presses.base_press import BasePress
from torch import nn


@dataclass
class FullPress(BasePress):
    """Keep every token (the full-cache baseline). ``compression_ratio`` is 0 by definition."""

    @property
    def compression_ratio(self) -> float:
        return 0.0

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return keys, values
