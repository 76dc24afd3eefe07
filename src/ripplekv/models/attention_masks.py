"""The attention masks of passes over KV caches whose layers hold different numbers of tokens.

transformers builds one mask per pass, sized from layer 0; :func:`fit_attention_mask` fits it to each layer (new
tokens causal among themselves, the cached prefix visible; a padded batch raises :class:`PaddedBatchError`).
Sliding-window layers are never compressed: their mask is rebuilt for their own length (:func:`sliding_window_mask`).
Unpadded passes make no host synchronisation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.masking_utils import causal_mask_function


class PaddedBatchError(ValueError):
    """A padded batch was used with a per-layer compressed cache (unsupported)."""


def sliding_window_mask(
    query_len: int,
    key_len: int,
    window: int,
    additive: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """The ``(1, 1, query_len, key_len)`` sliding-window causal mask of keys ending at the last query: query ``i``
    sees the ``window`` keys up to ``i + key_len - query_len`` (transformers' ``kv_idx > q_idx - window``), a float
    mask when ``additive`` (eager), else boolean (sdpa)."""
    if key_len <= window:
        return fit_attention_mask(None, query_len, key_len, additive, dtype, device=device)
    return _causal_mask(query_len, key_len, additive, dtype, device, window)


def sliding_layer_mask(
    mask: torch.Tensor | None,
    query_len: int,
    key_len: int,
    window: int,
    additive: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | None:
    """A sliding layer's mask: ``mask`` when built for ``key_len`` keys, else rebuilt (no padding: a mask of
    another length comes from a compressed first layer, which :func:`varlen_mask_function` allows unpadded only)."""
    if mask is not None and mask.shape[-1] == key_len:
        return mask
    return sliding_window_mask(query_len, key_len, window, additive, dtype, device)


def _causal_mask(
    query_len: int,
    key_len: int,
    additive: bool,
    dtype: torch.dtype,
    device: torch.device | str | None,
    window: int | None = None,
) -> torch.Tensor:
    """Bottom-right aligned causal mask on ``device``: query ``i`` sees every cached key and new keys ``<= i`` (only
    the last ``window`` when given)."""
    rows = torch.arange(query_len, device=device).unsqueeze(1) + (key_len - query_len)
    cols = torch.arange(key_len, device=device).unsqueeze(0)
    allowed = cols <= rows
    if window is not None:
        allowed = allowed & (cols > rows - window)
    allowed = allowed.view(1, 1, query_len, key_len)
    if not additive:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def fit_attention_mask(
    mask: torch.Tensor | None,
    query_len: int,
    key_len: int,
    additive: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """Fit the ``(batch, 1, query_len, kv_len_of_layer_0)`` mask transformers built for layer 0 (boolean or
    additive; None when none was built) to a layer holding ``key_len`` keys, the last ``query_len`` of them new.

    Returns ``(batch, 1, query_len, key_len)``, made on ``device`` when built from nothing, or None when none is
    needed (one query, or a causal square that sdpa handles with ``is_causal``).
    """
    if key_len < query_len:
        raise ValueError(f"layer holds {key_len} keys for {query_len} queries: the cache is inconsistent")
    if mask is None:
        if query_len == 1 or (query_len == key_len and not additive):
            return None
        return _causal_mask(query_len, key_len, additive, dtype, device)
    if mask.shape[-1] == key_len:
        return mask
    new = mask[..., mask.shape[-1] - query_len :]
    fill = 0.0 if additive else True
    prefix = torch.full((*mask.shape[:-1], key_len - query_len), fill, dtype=mask.dtype, device=mask.device)
    return torch.cat([prefix, new], dim=-1)


def headwise_attention_mask(
    base: torch.Tensor | None, keep: torch.Tensor, heads: int, query_len: int, key_len: int
) -> torch.Tensor:
    """The ``(batch, heads, query_len, key_len)`` boolean mask of a layer with head-wise masked entries (AdaKV):
    ``base`` (fitted; causal when ``None``; boolean: eager attention cannot take it) with the entries ``keep``
    (``(kv_heads, key_len)``) marks False hidden from every query head of their KV head's group."""
    if base is not None and base.dtype != torch.bool:
        raise ValueError("head-wise masked keys (AdaKV) need a boolean attention mask: use sdpa, not eager attention")
    allowed = fit_attention_mask(base, query_len, key_len, device=keep.device)
    if allowed is None:
        allowed = _causal_mask(query_len, key_len, False, torch.float32, keep.device)
    keep = keep.repeat_interleave(heads // keep.shape[0], dim=0)
    return allowed.to(keep.device) & keep.view(1, heads, 1, key_len)


def _plain_causal(kwargs: dict[str, Any]) -> bool:
    """Whether a pass's mask is plain causal: no padding, mask function, sliding window or chunk (``local_size``)."""
    if kwargs.get("attention_mask") is not None or kwargs.get("use_vmap", False):
        return False
    return (
        kwargs.get("local_size") is None and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
    )


def varlen_mask_function(base: Callable) -> Callable:
    """The mask function registered for ``ripplekv_sdpa`` / ``ripplekv_eager`` over transformers' ``base``
    (``sdpa_mask`` or ``eager_mask``), with its keyword signature."""

    def varlen_mask(
        *, cache_position: torch.Tensor, kv_length: int, kv_offset: int = 0, **kwargs: Any
    ) -> torch.Tensor | None:
        """``base``'s mask when the layer it is sized from holds every past position, else ``None`` (each layer
        builds its own; an unpadded causal pass always gets ``None``, with no host synchronisation).

        Raises:
            PaddedBatchError: for a padded batch over a compressed layer.
        """
        if _plain_causal(kwargs):
            return None
        query_len = cache_position.shape[0]
        if int(cache_position[0]) - kv_offset == kv_length - query_len:  # the layer holds every past token
            return base(cache_position=cache_position, kv_length=kv_length, kv_offset=kv_offset, **kwargs)
        padding = kwargs.get("attention_mask")
        if padding is not None and not bool(padding.bool().all()):
            raise PaddedBatchError(
                "a padded batch cannot attend over a compressed KV cache: use batch size 1 or unpadded batches"
            )
        return None

    return varlen_mask
