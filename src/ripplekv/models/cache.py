"""Cheap views of a prefilled KV cache.

A transformers ``DynamicCache`` grows by concatenation (``torch.cat`` allocates a new tensor), so a cache
whose layers *reference* the tensors of a prefilled cache can be run over and extended without ever
writing into the prefill. This is how profiling runs many continuations over one prefill, and how one
prefill can feed several compressed caches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KVPair = tuple[torch.Tensor, torch.Tensor]


def cache_tensors(cache: DynamicCache) -> list[KVPair]:
    """The ``(keys, values)`` tensors of every layer, shape ``(batch, kv_heads, tokens, head_dim)``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_tensors(pairs: Sequence[KVPair]) -> DynamicCache:
    """A ``DynamicCache`` whose layers hold the given tensors by reference (no copy).

    Appending to the returned cache never modifies the given tensors, since ``DynamicLayer.update``
    concatenates into new storage.
    """
    layers = []
    for keys, values in pairs:
        if keys.shape != values.shape:
            raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} differ in shape")
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        layers.append(layer)
    cache = DynamicCache()
    cache.layers = layers
    return cache


def layer_lengths(cache: DynamicCache) -> list[int]:
    """Number of cached tokens per layer."""
    return [layer.get_seq_length() for layer in cache.layers]


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes held by the keys and values of every layer."""
    return sum(t.numel() * t.element_size() for pair in cache_tensors(cache) for t in pair)
