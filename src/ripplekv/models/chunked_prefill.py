"""Prefill a prompt in chunks over its growing cache, so activations are bounded by the chunk, not the prompt.

A one-pass prefill's activations at 128K tokens on a 7-8B model exceed half the cache again. Chunked, the cache
equals a one-pass prefill's up to float rounding (other shapes, last bits); a prompt within one chunk runs exactly
the unchunked call. The default, 8,192 tokens, keeps every committed result (all within 8K) one pass and
accelerator matrix products about as efficient (``benchmarks/memory.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

from ripplekv.models.cache import ReservedLayer, cache_from_layers, cache_from_tensors, cache_tensors
from ripplekv.validation import is_integer

__all__ = ["DEFAULT_PREFILL_CHUNK", "check_prefill_chunk", "chunk_bounds", "prefill_in_chunks"]

DEFAULT_PREFILL_CHUNK = 8192
"""Default ``prefill_chunk``: prompts of at most 8,192 tokens prefill in one pass."""


def check_prefill_chunk(prefill_chunk: object) -> int | None:
    """``prefill_chunk`` validated: an integer >= 1 (tokens per chunk) or None (never chunk).

    Raises:
        ValueError: if it is not an integer >= 1 or None (a bool is refused).
    """
    if prefill_chunk is None:
        return None
    if not is_integer(prefill_chunk) or int(prefill_chunk) < 1:  # type: ignore[call-overload]
        raise ValueError(f"prefill_chunk must be an integer >= 1 (tokens per chunk) or None, got {prefill_chunk!r}")
    return int(prefill_chunk)  # type: ignore[call-overload]


def chunk_bounds(tokens: int, prefill_chunk: int | None) -> tuple[tuple[int, int], ...]:
    """The ``(start, end)`` of each chunk of a ``tokens``-token prompt, the last chunk shorter."""
    chunk = check_prefill_chunk(prefill_chunk)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be an int >= 1, got {tokens!r}")
    if chunk is None or tokens <= chunk:
        return ((0, tokens),)
    return tuple((start, min(start + chunk, tokens)) for start in range(0, tokens, chunk))


@torch.no_grad()
def prefill_in_chunks(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    prefill_chunk: int | None,
    cache: DynamicCache | None = None,
    before_chunk: Callable[[int, int], None] | None = None,
) -> tuple[DynamicCache, torch.Tensor]:
    """Prefill ``(batch, n)`` ids into ``cache`` (None: a new one) in chunks; returns it and the last ``(batch, 1,
    vocab)`` logits.

    Without a given cache, chunks fill one :class:`~ripplekv.models.cache.ReservedLayer` per layer, returned as a
    ``DynamicCache`` over its buffers. ``before_chunk(start, end)`` runs before each chunk's pass.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"expected prompt ids of shape (batch, n), n >= 1, got {tuple(input_ids.shape)}")
    tokens = int(input_ids.shape[1])
    bounds = chunk_bounds(tokens, prefill_chunk)
    if len(bounds) == 1:
        cache = DynamicCache() if cache is None else cache
        if before_chunk is not None:
            before_chunk(0, tokens)
        logits = model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        return cache, logits
    reserved = cache is None
    if cache is None:
        layers = int(model.config.get_text_config().num_hidden_layers)
        cache = cache_from_layers([ReservedLayer(tokens) for _ in range(layers)])
    for start, end in bounds:
        if before_chunk is not None:
            before_chunk(start, end)
        logits = model(input_ids[:, start:end], past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    if reserved:
        cache = cache_from_tensors(cache_tensors(cache))  # plain layers over the buffers (forkable, like any cache)
    return cache, logits
