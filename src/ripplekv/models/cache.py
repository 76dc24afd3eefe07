"""Cheap views of a prefilled KV cache.

A transformers ``DynamicCache`` grows by concatenation (``torch.cat`` allocates a new tensor), so a cache
whose layers *reference* the tensors of a prefilled cache can be run over and extended without ever
writing into the prefill. This is how profiling runs many continuations over one prefill, and how one
prefill can feed several compressed caches.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

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
    return cache_from_layers(layers)


def layer_lengths(cache: DynamicCache) -> list[int]:
    """Number of cached tokens per layer."""
    return [layer.get_seq_length() for layer in cache.layers]


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes held by the keys and values of every layer."""
    return sum(t.numel() * t.element_size() for pair in cache_tensors(cache) for t in pair)


class PreallocatedLayer(DynamicLayer):
    """A cache layer over buffers that already hold a prefix and have room for more tokens.

    ``update`` writes the new tokens into the buffers in place instead of concatenating (a ``torch.cat``
    copies the whole layer). Meant for many short passes over one long prefix: each pass builds new
    layer objects over the same buffers, starting at the prefix, and overwrites the tail of the previous pass.
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, prefix: int) -> None:
        super().__init__()
        if key_buffer.shape[:-1] != value_buffer.shape[:-1] or prefix > key_buffer.shape[-2]:
            raise ValueError("key and value buffers differ in shape or are shorter than the prefix")
        self.lazy_initialization(key_buffer, value_buffer)
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self.keys, self.values = key_buffer[..., :prefix, :], value_buffer[..., :prefix, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            raise ValueError(f"preallocated cache layer holds {self._key_buffer.shape[-2]} tokens, {end} needed")
        self._key_buffer[..., start:end, :].copy_(key_states)
        self._value_buffer[..., start:end, :].copy_(value_states)
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values


def cache_from_layers(layers: Sequence[DynamicLayer]) -> DynamicCache:
    """A ``DynamicCache`` made of the given layer objects."""
    cache = DynamicCache()
    cache.layers = list(layers)
    return cache


class PassThroughLayer(DynamicLayer):
    """A cache layer that stores nothing: ``update`` hands the new tokens straight back.

    For passes whose attention reads the cached prefix elsewhere (a shared prefix, see
    :mod:`ripplekv.models.shared_prefix`) and only needs each row's own new tokens from the cache.
    """

    def __init__(self, prefix: int) -> None:
        super().__init__()
        self.prefix = prefix

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.prefix


def fork_cache(cache: DynamicCache) -> DynamicCache:
    """A new cache container over the same tensors: running over the fork never changes ``cache``.

    Each layer object is copied shallowly (its tensors by reference); ``DynamicLayer`` and
    ``DynamicSlidingWindowLayer`` append through ``torch.cat`` and then rebind their attributes, so neither the
    given cache's layer objects nor its tensors are written by a pass over the fork. Layers that write into
    their buffers in place (:class:`PreallocatedLayer`) or store nothing (:class:`PassThroughLayer`), and any
    other layer type, are refused with a ``TypeError``.
    """
    layers = []
    for i, layer in enumerate(cache.layers):
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise TypeError(
                f"cannot fork cache layer {i} of type {type(layer).__name__}: only DynamicLayer and "
                "DynamicSlidingWindowLayer append without writing into their tensors"
            )
        layers.append(copy.copy(layer))
    return cache_from_layers(layers)
