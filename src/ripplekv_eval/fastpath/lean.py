"""Running the question over a derived cache without copying the prefill record it references."""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel

from ripplekv.inference.generate import Prefill, cache_forward
from ripplekv.models.cache import lean_fork


@torch.no_grad()
def lean_extend(model: PreTrainedModel, state: Prefill, input_ids: torch.Tensor) -> Prefill:
    """:func:`~ripplekv.inference.generate.extend` over a :func:`~ripplekv.models.cache.lean_fork` (same logits;
    ``state`` unchanged): the new ``(1, n)`` tokens are kept apart from ``state``'s tensors, held by reference."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"expected new tokens of shape (1, n), n >= 1, got {tuple(input_ids.shape)}")
    start = state.prompt_tokens
    positions = torch.arange(start, start + input_ids.shape[1], device=state.next_logits.device)
    cache = lean_fork(state.cache)
    start = time.perf_counter()
    logits = cache_forward(model, input_ids.to(positions.device), cache, positions, logits_to_keep=1)
    seconds = state.seconds + time.perf_counter() - start
    return Prefill(cache, logits[0, -1], int(positions[-1]) + 1, seconds)
