"""Cheap views of a prefilled KV cache: layers that reference a prefill's tensors, so many passes can run over
one prefill without writing into it (``DynamicLayer`` appends through ``torch.cat``, into new storage)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from ripplekv.models.headwise import HeadwiseMask, Indices, MaskedLayer

KVPair = tuple[torch.Tensor, torch.Tensor]


def cache_tensors(cache: DynamicCache) -> list[KVPair]:
    """The ``(keys, values)`` tensors of every layer, shape ``(batch, kv_heads, tokens, head_dim)``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_tensors(pairs: Sequence[KVPair]) -> DynamicCache:
    """A ``DynamicCache`` whose layers hold the given tensors by reference; appending never writes into them."""
    return cache_from_layers([dynamic_layer(keys, values) for keys, values in pairs])


def dynamic_layer(keys: torch.Tensor, values: torch.Tensor, masked: Indices | None = None) -> DynamicLayer:
    """A ``DynamicLayer`` holding ``keys`` and ``values`` by reference; a :class:`MaskedLayer` hiding the ``masked``
    entries (kvpress's ``(batch, kv_head, position)`` index tensors) from attention when given."""
    if keys.shape != values.shape:
        raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} differ in shape")
    if masked is not None:
        return MaskedLayer(keys, values, HeadwiseMask(masked, keys.shape[1], keys.shape[2]))
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
    """A cache layer over buffers holding a prefix, with room for more tokens written in place (no ``torch.cat``):
    many short passes over one long prefix each overwrite the previous pass's tail."""

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
            raise ValueError(f"the cache layer holds {self._key_buffer.shape[-2]} tokens, {end} needed")
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
    """A cache layer that stores nothing: ``update`` hands the new tokens back (the prefix is read elsewhere,
    :mod:`ripplekv.models.shared_prefix`)."""

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
    """A new cache over the same tensors (layers copied shallowly): running over the fork never changes ``cache``.
    TypeError for a layer that writes into its tensors (only ``DynamicLayer``, ``MaskedLayer`` and
    ``DynamicSlidingWindowLayer`` append through ``torch.cat``)."""
    layers = []
    for i, layer in enumerate(cache.layers):
        if type(layer) not in (DynamicLayer, MaskedLayer, DynamicSlidingWindowLayer):
            raise TypeError(
                f"cannot fork cache layer {i} of type {type(layer).__name__}: only DynamicLayer, MaskedLayer and "
                "DynamicSlidingWindowLayer append without writing into their tensors"
            )
        layers.append(copy.copy(layer))
    return cache_from_layers(layers)


class ReservedLayer(PreallocatedLayer):
    """A :class:`PreallocatedLayer` whose buffers, of ``tokens`` tokens, are made on its first update: for a prompt
    run in chunks, one buffer per layer instead of a copy per chunk (which also fragments an accelerator's memory)."""

    def __init__(self, tokens: int) -> None:
        DynamicLayer.__init__(self)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"tokens must be an int >= 1, got {tokens!r}")
        self.tokens = tokens
        self._key_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._key_buffer is None:
            self.lazy_initialization(key_states, value_states)
            self._key_buffer = key_states.new_empty((*key_states.shape[:2], self.tokens, key_states.shape[3]))
            self._value_buffer = value_states.new_empty((*value_states.shape[:2], self.tokens, value_states.shape[3]))
            self.keys, self.values = self._key_buffer[..., :0, :], self._value_buffer[..., :0, :]
        return super().update(key_states, value_states, cache_kwargs)


class OverlayLayer(DynamicLayer):
    """A cache layer over another layer's tensors (never written), with the tokens appended since kept apart:
    ``update`` returns base plus appended as a new tensor it does not keep, so a pass holds one layer's
    concatenation at a time where a ``DynamicLayer`` fork keeps a second full cache."""

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
    """A fork of ``cache`` of :class:`OverlayLayer` layers (no copy); others (a sliding window's, which crops
    itself) are forked by :func:`fork_cache`. Running over the fork never changes ``cache``."""
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
