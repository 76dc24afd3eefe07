"""The attention masks of passes over KV caches whose layers hold different numbers of tokens.

One concern: which keys each query of a layer may see. transformers builds one attention mask per forward pass,
sized from layer 0 (``kv_len = n_0 + q_len``); here that mask is *fitted* to each layer's own key length
(:func:`fit_attention_mask`). The columns of the new tokens (the last ``q_len``) are kept as they are (causal
among themselves); the cached prefix of the layer is fully visible, which is exact for batches without padding. A
padded batch raises (:class:`PaddedBatchError`) instead of attending to the wrong tokens; a pass over a padded
batch of compressed caches carries a ``key_validity`` instead (:mod:`ripplekv.models.attention_functions`).

Sliding-window layers (Gemma 3's local layers) attend to the last ``W`` positions only. They are never compressed
(:mod:`ripplekv.models.layer_types`): their keys are the whole sequence (a ``DynamicLayer``) or its last ``W - 1``
positions plus the new ones (transformers' ``DynamicSlidingWindowLayer``), contiguous positions ending at the
pass's last token either way. A sliding layer therefore uses the library's own sliding mask as it is (built from
the cache's sizes, window offset included) and is never fitted; when that mask was built for another layer's
length (the cache's first layer is a compressed global one) it gets the model's sliding mask rebuilt for its own
keys: query ``i`` sees the ``W`` keys ending at its own, bottom-right aligned (:func:`sliding_window_mask`).

:func:`varlen_mask_function` wraps transformers' ``sdpa_mask`` / ``eager_mask`` into the mask function registered
for ``ripplekv_sdpa`` / ``ripplekv_eager`` (:mod:`ripplekv.models.attention`).

Device placement: every mask is built on the device of the tensors it is combined with, once per layer and pass
at most, never copied between devices. The mask function makes no host synchronisation on unpadded passes; a pass
with a 2D ``attention_mask`` (padding) costs one per forward pass (is it all ones, does layer 0 hold every
position), as transformers' own sdpa mask does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.masking_utils import causal_mask_function

__all__ = [
    "PaddedBatchError",
    "fit_attention_mask",
    "headwise_attention_mask",
    "sliding_layer_mask",
    "sliding_window_mask",
    "varlen_mask_function",
]


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
    """The sliding-window causal mask of a layer whose keys are contiguous positions ending at the last query.

    Query ``i`` (the ``i``-th of the last ``query_len`` keys) sees the keys ``j`` with
    ``i + key_len - query_len - window < j <= i + key_len - query_len``: transformers'
    ``sliding_window_causal_mask_function`` (``kv_idx > q_idx - window``) in the layer's own key positions.

    Args:
        query_len: new tokens of the pass (the last ``query_len`` keys).
        key_len: keys of the layer, its cached tokens plus the new ones.
        window: the sliding window ``W``.
        additive: build an additive float mask (eager) rather than a boolean one (sdpa).
        dtype: float dtype of an additive mask.
        device: where the mask is made (the device of the queries it is used with).

    Returns:
        A ``(1, 1, query_len, key_len)`` mask, or ``None`` when the keys fit the window and no mask is needed
        (see :func:`fit_attention_mask`).
    """
    if key_len <= window:
        return fit_attention_mask(None, query_len, key_len, additive, dtype, device=device)
    rows = torch.arange(query_len, device=device).unsqueeze(1) + (key_len - query_len)
    cols = torch.arange(key_len, device=device).unsqueeze(0)
    allowed = ((cols <= rows) & (cols > rows - window)).view(1, 1, query_len, key_len)
    if not additive:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def sliding_layer_mask(
    mask: torch.Tensor | None,
    query_len: int,
    key_len: int,
    window: int,
    additive: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | None:
    """A sliding layer's mask: the library's own when it was built for this layer's keys, else rebuilt.

    A mask built for another length was built from a compressed first layer, which the mask function
    (:func:`varlen_mask_function`) allows for unpadded batches only, so the rebuilt mask needs no padding.

    Args:
        mask: the mask transformers built for the pass (sized from the layer it was built for), or ``None``.
        query_len: new tokens of the pass (the last ``query_len`` keys).
        key_len: keys of this layer, its cached tokens plus the new ones.
        window: the layer's sliding window ``W``.
        additive: build an additive float mask (eager) rather than a boolean one (sdpa).
        dtype: float dtype of an additive mask.
        device: where a rebuilt mask is made (the device of the queries).
    """
    if mask is not None and mask.shape[-1] == key_len:
        return mask
    return sliding_window_mask(query_len, key_len, window, additive, dtype, device)


def _causal_mask(
    query_len: int, key_len: int, additive: bool, dtype: torch.dtype, device: torch.device | str | None
) -> torch.Tensor:
    """Bottom-right aligned causal mask on ``device``: query ``i`` sees every cached key and new keys ``<= i``."""
    rows = torch.arange(query_len, device=device).unsqueeze(1)
    cols = torch.arange(key_len, device=device).unsqueeze(0)
    allowed = (cols <= rows + (key_len - query_len)).view(1, 1, query_len, key_len)
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
    """Fit the mask transformers built for layer 0 to a layer holding ``key_len`` keys.

    Args:
        mask: the 4D mask of the forward pass, shape ``(batch, 1, query_len, kv_len_of_layer_0)``, boolean
            (True = attend) or additive float (0 = attend); ``None`` when no mask was built, either because
            transformers skipped it (plain causal square) or because the mask function
            (:func:`varlen_mask_function`) left it to the layers.
        query_len: number of new tokens in this pass; they are the last ``query_len`` keys of every layer.
        key_len: number of keys of this layer (its cached tokens plus the new ones).
        additive: build additive float masks (eager) rather than boolean ones (sdpa).
        dtype: float dtype of additive masks.
        device: where a mask built from nothing (``mask`` is ``None``) is made: the device of the queries it
            will be used with (default: ``mask``'s device, else the CPU). A fitted ``mask`` stays on its device.

    Returns:
        A ``(batch, 1, query_len, key_len)`` mask, or ``None`` when none is needed (one query, or a causal
        square that sdpa handles with ``is_causal``).
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
    base: torch.Tensor | None,
    head: torch.Tensor,
    position: torch.Tensor,
    heads: int,
    kv_heads: int,
    query_len: int,
    key_len: int,
    device: torch.device | str | None,
) -> torch.Tensor:
    """The boolean mask of one layer with head-wise masked cached entries (AdaKV) excluded exactly.

    Args:
        base: the mask the layer received (boolean, True = attend; ``None`` when transformers built none).
        head, position: the masked entries' KV heads and positions (among the cached keys).
        heads: query heads of the layer; each KV head's entries are hidden from every query head of its group.
        kv_heads: key/value heads of the layer.
        query_len: new tokens of the pass (the last ``query_len`` keys).
        key_len: keys of the layer in the pass (cached plus new).
        device: where the mask is made (the device of the queries).

    Returns:
        ``(batch, heads, query_len, key_len)``: ``base`` fitted to the layer (bottom-right causal when ``None``) and
        the masked entries.

    Raises:
        ValueError: for an additive (float) ``base``: eager attention cannot take the boolean mask.
    """
    if base is not None and base.dtype != torch.bool:
        raise ValueError("head-wise masked keys (AdaKV) need a boolean attention mask: use sdpa, not eager attention")
    allowed = fit_attention_mask(base, query_len, key_len, device=device)
    if allowed is None:
        allowed = _causal_mask(query_len, key_len, False, torch.float32, device)
    keep = torch.ones(kv_heads, key_len, dtype=torch.bool, device=device)
    keep[head.to(device), position.to(device)] = False
    keep = keep.repeat_interleave(heads // kv_heads, dim=0)
    return allowed.to(device) & keep.view(1, heads, 1, key_len)


def _plain_causal(kwargs: dict[str, Any]) -> bool:
    """Whether a pass's mask is plain causal: no padding, no custom mask function, no sliding window or chunk
    (transformers passes their size as ``local_size``)."""
    if kwargs.get("attention_mask") is not None or kwargs.get("use_vmap", False):
        return False
    return (
        kwargs.get("local_size") is None and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
    )


def varlen_mask_function(base: Callable) -> Callable:
    """The mask function registered for a variable-length attention implementation, over transformers' ``base``.

    Args:
        base: transformers' mask function of the stock implementation (``sdpa_mask`` or ``eager_mask``).

    Returns:
        A mask function with ``base``'s keyword signature (see its inner docstring for what it returns).
    """

    def varlen_mask(
        *, cache_position: torch.Tensor, kv_length: int, kv_offset: int = 0, **kwargs: Any
    ) -> torch.Tensor | None:
        """The mask of the layer transformers sized it from, or ``None`` to let each layer's attention build its own.

        An unpadded causal pass needs no mask from here: every layer's new queries see all of its cached keys and
        the new keys up to themselves (what the attention function does when it gets ``None``), whatever the
        layer holds, so no host synchronisation is made. A padded batch (a 2D ``attention_mask`` with zeros), a
        custom mask function or a sliding-window mask (``local_size``) gets the library's own mask when the layer
        it is sized from holds every past position from ``kv_offset`` on (a sliding-window cache layer holds its
        window only); this costs one host synchronisation per forward pass (reading ``cache_position[0]`` and
        whether the mask is all ones), as transformers' own sdpa mask does. A padded batch over a compressed layer
        raises; a sliding layer handed ``None`` rebuilds its own sliding mask (sliding layers are never
        compressed).
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
