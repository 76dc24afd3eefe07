"""Cheap views of a prefilled KV cache.

A transformers ``DynamicCache`` grows by concatenation (``torch.cat`` allocates a new tensor), so a cache
whose layers *reference* the tensors of a prefilled cache can be run over and extended without ever
writing into the prefill. This is how profiling runs many continuations over one prefill, and how one
prefill can feed several compressed caches.

:class:`OverlayLayer` (and :func:`lean_fork`) goes one step further: it keeps the cache it runs over by reference
and the tokens a pass appends apart, so a pass over the fork never holds a second copy of the cache.
:class:`ReservedLayer` is the cache of a prompt prefilled in chunks: one buffer per layer, the prompt's size,
written chunk by chunk.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from ripplekv.models.headwise import HeadwiseMask, MaskedLayer

KVPair = tuple[torch.Tensor, torch.Tensor]


def cache_tensors(cache: DynamicCache) -> list[KVPair]:
    """The ``(keys, values)`` tensors of every layer, shape ``(batch, kv_heads, tokens, head_dim)``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_tensors(pairs: Sequence[KVPair]) -> DynamicCache:
    """A ``DynamicCache`` whose layers hold the given tensors by reference (no copy).

    Appending to the returned cache never modifies the given tensors, since ``DynamicLayer.update``
    concatenates into new storage.
    """
    return cache_from_layers([dynamic_layer(keys, values) for keys, values in pairs])


def dynamic_layer(keys: torch.Tensor, values: torch.Tensor) -> DynamicLayer:
    """A ``DynamicLayer`` holding ``keys`` and ``values`` by reference."""
    if keys.shape != values.shape:
        raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} differ in shape")
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer


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

    Each layer object is copied shallowly (its tensors, and a head-wise mask, by reference); ``DynamicLayer``,
    :class:`~ripplekv.models.headwise.MaskedLayer` and ``DynamicSlidingWindowLayer`` append through ``torch.cat`` and
    then rebind their attributes, so neither the given cache's layer objects nor its tensors are written by a pass over
    the fork. Layers that write into
    their buffers in place (:class:`PreallocatedLayer`) or store nothing (:class:`PassThroughLayer`), and any
    other layer type, are refused with a ``TypeError``.
    """
    layers = []
    for i, layer in enumerate(cache.layers):
        if type(layer) not in (DynamicLayer, MaskedLayer, DynamicSlidingWindowLayer):
            raise TypeError(
                f"cannot fork cache layer {i} of type {type(layer).__name__}: only DynamicLayer, MaskedLayer and "
                "DynamicSlidingWindowLayer append without writing into their tensors"
            )
        layers.append(copy.copy(layer))
    return cache_from_layers(layers)


class ReservedLayer(DynamicLayer):
    """A cache layer that reserves room for ``tokens`` tokens on its first update and writes every update into it.

    For a prompt of known length run in chunks (:func:`ripplekv.models.chunked_prefill.prefill_in_chunks`): each
    layer holds one buffer of the prompt's size from the first chunk on, instead of a ``DynamicLayer``'s
    concatenation per chunk (a new copy of the layer each time, and on an accelerator a caching allocator left with
    blocks of every intermediate size). ``keys`` and ``values`` are views of the buffers up to the tokens written;
    after the last chunk they are the whole buffers. The buffers are made with ``new_empty`` from the first update's
    tensors (their device and dtype).

    Args:
        tokens: the room, in tokens (>= 1).
    """

    def __init__(self, tokens: int) -> None:
        super().__init__()
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens must be an int >= 1, got {tokens!r}")
        self.tokens = tokens
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._key_buffer is None or self._value_buffer is None:
            self.lazy_initialization(key_states, value_states)
            self._key_buffer = key_states.new_empty((*key_states.shape[:2], self.tokens, key_states.shape[3]))
            self._value_buffer = value_states.new_empty((*value_states.shape[:2], self.tokens, value_states.shape[3]))
            start = 0
        else:
            start = int(self.keys.shape[-2])
        end = start + int(key_states.shape[-2])
        if end > self.tokens:
            raise ValueError(f"reserved cache layer holds {self.tokens} tokens, {end} needed")
        self._key_buffer[..., start:end, :].copy_(key_states)
        self._value_buffer[..., start:end, :].copy_(value_states)
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values


class OverlayLayer(DynamicLayer):
    """A cache layer over another layer's tensors, held by reference, with the tokens appended since kept apart.

    ``update`` appends the new tokens to the layer's own (short) tensors and returns the whole layer, base then
    appended, as a new tensor it does not keep. A pass therefore allocates one layer's concatenation at a time and
    frees it after that layer's attention, where a ``DynamicLayer`` fork (``torch.cat`` into its own storage)
    keeps a copy of every layer, one more full cache for a pass over the full cache, for as long as the fork
    lives. Attention receives the same tensors either way, under any attention implementation (each step also
    copies the layer once, as ``DynamicLayer.update`` does).

    Args:
        keys, values: the base layer's ``(batch, kv_heads, n, head_dim)`` tensors (never written).
        appended: tokens appended after them, as ``(keys, values)`` (default: none).
        headwise: the base layer's head-wise mask (a :class:`~ripplekv.models.headwise.MaskedLayer`'s), or None.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        appended: KVPair | None = None,
        headwise: HeadwiseMask | None = None,
    ) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.base_keys, self.base_values = keys, values
        self.headwise = headwise
        if appended is None:
            empty = (*keys.shape[:2], 0)
            appended = (keys.new_empty((*empty, keys.shape[3])), values.new_empty((*empty, values.shape[3])))
        self.keys, self.values = appended

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.whole()

    def whole(self) -> KVPair:
        """The layer's keys and values, base then appended (a new tensor when tokens were appended)."""
        if not self.keys.shape[-2]:
            return self.base_keys, self.base_values
        return torch.cat([self.base_keys, self.keys], dim=-2), torch.cat([self.base_values, self.values], dim=-2)

    def get_seq_length(self) -> int:
        return int(self.base_keys.shape[-2] + self.keys.shape[-2])

    def fork(self) -> OverlayLayer:
        """A new layer over the same base and appended tensors and head-wise mask (by reference)."""
        return OverlayLayer(self.base_keys, self.base_values, (self.keys, self.values), self.headwise)


def lean_fork(cache: DynamicCache) -> DynamicCache:
    """A fork of ``cache`` that holds its tensors by reference and what a pass appends apart (no copy).

    ``DynamicLayer``, :class:`~ripplekv.models.headwise.MaskedLayer` (its mask kept) and :class:`OverlayLayer` layers
    become :class:`OverlayLayer`; any other layer (a sliding window's, which crops itself) is forked as
    :func:`fork_cache` forks it, the exact copying path. Running over the fork never changes ``cache``.

    Args:
        cache: the cache to fork.
    """
    layers: list[DynamicLayer] = []
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layers.append(OverlayLayer(layer.keys, layer.values))
        elif type(layer) is MaskedLayer:
            layers.append(OverlayLayer(layer.keys, layer.values, headwise=layer.headwise))
        elif isinstance(layer, OverlayLayer):
            layers.append(layer.fork())
        else:
            layers.append(fork_cache(cache_from_layers([layer])).layers[0])
    return cache_from_layers(layers)
