"""Prefill a prompt in chunks over its growing cache, so activations are bounded by the chunk, not the prompt.

A one-pass prefill of ``n`` tokens holds, on top of the cache it fills, one layer's activations over all ``n``
tokens (the MLP's ``n x intermediate`` products, the attention's queries and outputs): on a 7-8B model at 128K
tokens, more than half of the cache again. Run in chunks of at most ``c`` tokens over the cache the earlier chunks
filled (each at its true positions; attention over the cache, then causal within the chunk), the same prefill holds
one chunk's activations. The cache is what a one-pass prefill builds up to float rounding: the matrix products and
attention reductions run over other shapes, so chunked and one-pass caches differ in the last bits.

A prompt of at most ``prefill_chunk`` tokens is one chunk and runs exactly as an unchunked prefill (the same call),
so no result of a prompt within the chunk depends on chunking. :data:`DEFAULT_PREFILL_CHUNK` is 8,192 tokens: every
result committed under ``benchmarks/results`` (all within 8K tokens) stays one pass; one chunk's activations are
those of an 8K-token prefill, a small fraction of a 128K-token cache on 7-8B models
(``benchmarks/memory.py`` computes them); and chunks of 8K tokens keep an accelerator's matrix products about as
efficient as one pass.

A chunked prefill writes into a :class:`~ripplekv.models.cache.ReservedLayer` per layer (one buffer of the
prompt's size, no concatenation per chunk) and returns an ordinary ``DynamicCache`` over those buffers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

from ripplekv.models.cache import ReservedLayer, cache_from_layers, cache_from_tensors, cache_tensors
from ripplekv.validation import is_integer

__all__ = ["DEFAULT_PREFILL_CHUNK", "check_prefill_chunk", "chunk_bounds", "prefill_in_chunks"]

DEFAULT_PREFILL_CHUNK = 8192
"""Default ``prefill_chunk``: prompts of at most 8,192 tokens prefill in one pass (see the module docstring)."""


def check_prefill_chunk(prefill_chunk: object) -> int | None:
    """``prefill_chunk`` validated: an integer >= 1 (tokens per chunk) or None (never chunk).

    Args:
        prefill_chunk: the value to check.

    Raises:
        ValueError: if it is not an integer >= 1 or None (a bool is refused).
    """
    if prefill_chunk is None:
        return None
    if not is_integer(prefill_chunk) or int(prefill_chunk) < 1:  # type: ignore[call-overload]
        raise ValueError(f"prefill_chunk must be an integer >= 1 (tokens per chunk) or None, got {prefill_chunk!r}")
    return int(prefill_chunk)  # type: ignore[call-overload]


def chunk_bounds(tokens: int, prefill_chunk: int | None) -> tuple[tuple[int, int], ...]:
    """The ``(start, end)`` of each chunk of a ``tokens``-token prompt: chunks of ``prefill_chunk``, the last shorter.

    Args:
        tokens: prompt length (>= 1).
        prefill_chunk: tokens per chunk (:func:`check_prefill_chunk`); None: one chunk.
    """
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
    """Prefill ``input_ids`` into a cache in chunks of at most ``prefill_chunk`` tokens; the last position's logits.

    One chunk (a prompt within ``prefill_chunk``, or None) is the unchunked call,
    ``model(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)``, into ``cache`` or a new
    ``DynamicCache``. Several chunks run one forward pass each over the same cache, at their true positions (which
    transformers takes from the cache's length); without a given cache they fill a
    :class:`~ripplekv.models.cache.ReservedLayer` per layer and the result is a ``DynamicCache`` over its buffers.

    Args:
        model: the model.
        input_ids: ``(batch, n)`` prompt ids, on the model's device.
        prefill_chunk: tokens per chunk (:func:`check_prefill_chunk`); None: one pass.
        cache: the cache to fill in place (extended by ``torch.cat`` per chunk); None: a new one.
        before_chunk: called with ``(start, end)`` before each chunk's pass (hooks that record per chunk).

    Returns:
        The filled cache and the logits of the prompt's last position, ``(batch, 1, vocab)``.
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
