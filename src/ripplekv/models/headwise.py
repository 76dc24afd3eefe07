"""Cache layers that hide some of their entries from attention, KV head by KV head (AdaKV's head-wise masks).

AdaKV (Feng et al. 2024, arXiv:2407.11550) and LAVa mask a layer's dropped (KV head, position) entries. The mask
belongs to one compressed cache, so its layer holds it (:class:`MaskedLayer`), and every attention pass over the
layer reads it there (:func:`ripplekv.models.attention.read_cache_masks`). ripplekv's presses write the masked layer
into the cache; kvpress's own (``AdaKVPress``) leave the mask on the attention module as ``masked_key_indices``,
which :func:`take_mask` moves into the cache layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ripplekv.models.attention_masks import headwise_attention_mask
from ripplekv.models.decoder import find_decoder

MASKED_KEYS = "masked_key_indices"
"""kvpress's attention-module attribute for head-wise masks: ``(batch, kv_head, position)`` index tensors."""

Indices = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class HeadwiseMask:
    """The (KV head, position) entries of a cache layer that attention skips: kvpress's ``(batch, kv_head,
    position)`` index tensors (batch size 1) over ``length`` cached positions, validated once (one host sync)."""

    indices: Indices
    kv_heads: int
    length: int

    def __post_init__(self) -> None:
        indices = tuple(self.indices)
        if len(indices) != 3 or not all(isinstance(t, torch.Tensor) for t in indices):
            raise ValueError(f"{MASKED_KEYS} must be (batch, head, position) index tensors, got {len(indices)} items")
        object.__setattr__(self, "indices", indices)
        batch, head, position = indices
        if batch.numel() and int(batch.max()) > 0:
            raise ValueError("head-wise masked keys are supported for batch size 1 only")
        if head.numel() and int(head.max()) >= self.kv_heads:
            raise ValueError(f"{MASKED_KEYS} point outside the cached keys of the layer ({self.kv_heads} KV heads)")
        if position.numel() and int(position.max()) >= self.length:
            raise ValueError(f"{MASKED_KEYS} point outside the cached keys of the layer ({self.length} positions)")

    @property
    def entries(self) -> int:
        """Masked (head, position) entries."""
        return int(self.indices[1].numel())

    def keep(self, length: int, device: torch.device | str | None = None) -> torch.Tensor:
        """``(kv_heads, length)`` boolean, False on the masked entries (``length >= self.length``: appended tokens
        are kept), on ``device`` (default: the indices')."""
        device = self.indices[1].device if device is None else device
        keep = torch.ones(self.kv_heads, length, dtype=torch.bool, device=device)
        keep[self.indices[1].to(device), self.indices[2].to(device)] = False
        return keep

    def attention_mask(
        self, base: torch.Tensor | None, heads: int, query_len: int, key_len: int, device: torch.device
    ) -> torch.Tensor:
        """The layer's boolean mask in a pass, masked entries excluded (:func:`headwise_attention_mask`)."""
        if key_len - query_len < self.length:
            raise ValueError(f"{MASKED_KEYS} point outside the cached keys of the layer")
        return headwise_attention_mask(base, self.keep(key_len, device), heads, query_len, key_len)


class MaskedLayer(DynamicLayer):
    """A ``DynamicLayer`` some of whose cached entries attention skips, per KV head (its :class:`HeadwiseMask`);
    appended tokens are seen by every head."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, headwise: HeadwiseMask) -> None:
        super().__init__()
        if (headwise.kv_heads, headwise.length) != (keys.shape[1], keys.shape[2]):
            raise ValueError(
                f"a head-wise mask of {headwise.kv_heads} heads x {headwise.length} positions over keys of shape "
                f"{tuple(keys.shape)}"
            )
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self.headwise = headwise


def headwise_of(layer: object) -> HeadwiseMask | None:
    """The head-wise mask a cache layer holds (``headwise`` of :class:`MaskedLayer` and of its lean forks,
    :class:`~ripplekv.models.cache.OverlayLayer`), None for any other layer."""
    return getattr(layer, "headwise", None)


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The attention module of every decoder layer (``model.get_decoder().layers[i].self_attn``)."""
    decoder = find_decoder(model)
    layers = None if decoder is None else decoder.layers
    if layers is None or not all(hasattr(layer, "self_attn") for layer in layers):
        raise TypeError(
            f"cannot find the attention modules of {type(model).__name__} "
            "(expected model.get_decoder().layers[i].self_attn)"
        )
    return [layer.self_attn for layer in layers]


def discard_masks(modules: Iterable[nn.Module]) -> None:
    """Remove kvpress's head-wise masks from ``modules``: before a compression (a mask left there by a kvpress press
    used directly belongs to no cache it makes) and after a failed one."""
    for module in modules:
        vars(module).pop(MASKED_KEYS, None)


def take_mask(module: nn.Module, layer: DynamicLayer) -> DynamicLayer:
    """``layer``, as a :class:`MaskedLayer` holding the head-wise mask a kvpress press (``AdaKVPress``) left on
    ``module`` (removed there); ValueError for a mask on a sliding-window layer or one that does not fit the layer's
    keys."""
    indices = vars(module).pop(MASKED_KEYS, None)
    if indices is None:
        return layer
    if layer.is_sliding:
        raise ValueError("head-wise masked keys are not supported on sliding-window layers")
    return MaskedLayer(layer.keys, layer.values, HeadwiseMask(indices, layer.keys.shape[1], layer.keys.shape[2]))
