"""Attention over KV caches whose layers hold different numbers of tokens.

After per-layer compression (RippleKV, PyramidKV, ...) layer ``l`` of the cache holds ``n_l`` tokens, but
transformers builds one attention mask per forward pass, sized from layer 0 (``kv_len = n_0 + q_len``).
Single-token decoding survives because sdpa needs no mask for one query, yet any multi-token pass over the
compressed cache (a question appended after the context, a teacher-forced continuation) fails with a shape
error, or, worse, silently uses ``is_causal=True`` with top-left alignment.

The fix here lives at the one place that knows both lengths, the attention function: the mask built for
layer 0 is *fitted* to each layer's own key length. The columns of the new tokens (the last ``q_len``) are
kept as they are (causal among themselves); the cached prefix of the layer is fully visible, which is exact
for batches without padding. A padded batch raises instead of attending to the wrong tokens, unless the pass
carries a ``key_validity`` (:class:`ripplekv.models.padded.KeyValidity`): several compressed caches of one prompt
run as one batch, each layer's mask built from which cached entries each row may see.

Sliding-window layers (Gemma 3's local layers) attend to the last ``W`` positions only. They are never compressed
(:mod:`ripplekv.models.layer_types`): their keys are the whole sequence (a ``DynamicLayer``) or its last ``W - 1``
positions plus the new ones (transformers' ``DynamicSlidingWindowLayer``), contiguous positions ending at the
pass's last token either way. A sliding layer therefore uses the library's own sliding mask as it is (built from
the cache's sizes, window offset included) and is never fitted; when that mask was built for another layer's
length (the cache's first layer is a compressed global one) it gets the model's sliding mask rebuilt for its own
keys: query ``i`` sees the ``W`` keys ending at its own, bottom-right aligned (:func:`sliding_window_mask`).

The functions are registered under new names through transformers' public ``AttentionInterface`` and
``AttentionMaskInterface`` (nothing of the library is patched): ``ripplekv_sdpa`` and ``ripplekv_eager``.
When every layer has the same length they compute exactly what ``sdpa`` and ``eager`` compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from ripplekv.models.padded import KeyValidity, RaggedLayer
from ripplekv.models.shared_prefix import shared_prefix_attention

VARLEN_PREFIX = "ripplekv_"


class PaddedBatchError(ValueError):
    """A padded batch was used with a per-layer compressed cache (unsupported)."""


class SlidingWindowError(ValueError):
    """A pass that cannot serve a sliding-window layer beyond its window (the shared-prefix attention)."""


def sliding_window_mask(
    query_len: int, key_len: int, window: int, additive: bool = False, dtype: torch.dtype = torch.float32
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

    Returns:
        A ``(1, 1, query_len, key_len)`` mask, or ``None`` when the keys fit the window and no mask is needed
        (see :func:`fit_attention_mask`).
    """
    if key_len <= window:
        return fit_attention_mask(None, query_len, key_len, additive, dtype)
    rows = torch.arange(query_len).unsqueeze(1) + (key_len - query_len)
    cols = torch.arange(key_len).unsqueeze(0)
    allowed = ((cols <= rows) & (cols > rows - window)).view(1, 1, query_len, key_len)
    if not additive:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def _sliding_layer_mask(
    mask: torch.Tensor | None, query_len: int, key_len: int, window: int, additive: bool, dtype: torch.dtype
) -> torch.Tensor | None:
    """A sliding layer's mask: the library's own when it was built for this layer's keys, else rebuilt.

    A mask built for another length was built from a compressed first layer, which :func:`varlen_mask` allows for
    unpadded batches only, so the rebuilt mask needs no padding.
    """
    if mask is not None and mask.shape[-1] == key_len:
        return mask
    return sliding_window_mask(query_len, key_len, window, additive, dtype)


def _causal_mask(query_len: int, key_len: int, additive: bool, dtype: torch.dtype) -> torch.Tensor:
    """Bottom-right aligned causal mask: query ``i`` sees every cached key and new keys ``<= i``."""
    rows = torch.arange(query_len).unsqueeze(1)
    cols = torch.arange(key_len).unsqueeze(0)
    allowed = (cols <= rows + (key_len - query_len)).view(1, 1, query_len, key_len)
    if not additive:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def fit_attention_mask(
    mask: torch.Tensor | None,
    query_len: int,
    key_len: int,
    additive: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | None:
    """Fit the mask transformers built for layer 0 to a layer holding ``key_len`` keys.

    Args:
        mask: the 4D mask of the forward pass, shape ``(batch, 1, query_len, kv_len_of_layer_0)``, boolean
            (True = attend) or additive float (0 = attend); ``None`` when no mask was built, either because
            transformers skipped it (plain causal square) or because :func:`varlen_mask` found layer 0
            compressed.
        query_len: number of new tokens in this pass; they are the last ``query_len`` keys of every layer.
        key_len: number of keys of this layer (its cached tokens plus the new ones).
        additive: build additive float masks (eager) rather than boolean ones (sdpa).
        dtype: float dtype of additive masks.

    Returns:
        A ``(batch, 1, query_len, key_len)`` mask, or ``None`` when none is needed (one query, or a causal
        square that sdpa handles with ``is_causal``).
    """
    if key_len < query_len:
        raise ValueError(f"layer holds {key_len} keys for {query_len} queries: the cache is inconsistent")
    if mask is None:
        if query_len == 1 or (query_len == key_len and not additive):
            return None
        return _causal_mask(query_len, key_len, additive, dtype)
    if mask.shape[-1] == key_len:
        return mask
    new = mask[..., mask.shape[-1] - query_len :]
    fill = 0.0 if additive else True
    prefix = torch.full((*mask.shape[:-1], key_len - query_len), fill, dtype=mask.dtype, device=mask.device)
    return torch.cat([prefix, new], dim=-1)


def _make_mask(base: Callable) -> Callable:
    def varlen_mask(
        *, cache_position: torch.Tensor, kv_length: int, kv_offset: int = 0, **kwargs: Any
    ) -> torch.Tensor | None:
        """The mask of the layer transformers sized it from: the library's own when that layer is whole (every past
        token from ``kv_offset`` on: a sliding-window cache layer holds its window only), else left to the attention
        function."""
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


def sdpa_gqa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention without copying keys and values for grouped-query attention.

    transformers repeats the KV heads (a full copy of the layer's cache) whenever a mask is present, because
    some GPU kernels reject ``enable_gqa`` with a mask; on the CPU torch handles both together, and every
    multi-token pass over a cache (a question after the context, a profiling continuation) has a mask.
    """
    groups = query.shape[1] // key.shape[1]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=groups > 1,
    )
    return out.transpose(1, 2).contiguous(), None


def _validity_mask(
    module: torch.nn.Module, validity: KeyValidity, query: torch.Tensor, key: torch.Tensor
) -> torch.Tensor:
    """The mask of a pass over a padded batch of caches; it replaces the one transformers built for layer 0."""
    if not isinstance(validity, KeyValidity):
        raise TypeError(f"key_validity must be a KeyValidity, got {type(validity).__name__}")
    if getattr(module, "masked_key_indices", None) is not None:
        raise ValueError("a padded batch carries head-wise masks in its key validity, not in masked_key_indices")
    if validity.rows != query.shape[0]:
        raise ValueError(f"key validity for {validity.rows} rows, the pass has {query.shape[0]}")
    allowed = validity.mask(module.layer_idx, query.shape[2], key.shape[2], query.shape[1])
    # Additive even for sdpa: torch's CPU kernel converts a boolean mask to this on every call (slower).
    return torch.zeros(allowed.shape, dtype=query.dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(query.dtype).min
    )


def _ragged_attention(
    module: torch.nn.Module, query: torch.Tensor, ragged: Any, scaling: float | None, window: int | None = None
) -> torch.Tensor:
    """Each row's queries over that row's own keys and values (a :class:`RaggedLayer` of ``ragged``); a sliding
    layer's (``window``) keys, never compressed, get its sliding mask too."""
    layer = ragged.layers[module.layer_idx]
    if not isinstance(layer, RaggedLayer):
        raise TypeError(f"ragged_cache layer {module.layer_idx} is a {type(layer).__name__}, not a RaggedLayer")
    if getattr(module, "masked_key_indices", None) is not None:
        raise ValueError("a ragged batch carries head-wise masks in its rows, not in masked_key_indices")
    heads, query_len = query.shape[1], query.shape[2]
    outputs = []
    for row in range(query.shape[0]):
        keys, values = layer.row(row)
        mask = layer.row_mask(row, query_len, heads)
        band = None if window is None else sliding_window_mask(query_len, keys.shape[2], window)
        if band is not None:
            mask = band.to(keys.device) if mask is None else mask & band.to(mask.device)
        outputs.append(
            torch.nn.functional.scaled_dot_product_attention(
                query[row : row + 1],
                keys,
                values,
                attn_mask=None if mask is None else mask.to(query.device),
                scale=scaling,
                is_causal=False,
                enable_gqa=heads != keys.shape[1],
            )
        )
    return torch.cat(outputs, dim=0).transpose(1, 2).contiguous()


def _make_attention(base_name: str, default: Callable, additive: bool) -> Callable:
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        window = kwargs.get("sliding_window")  # a sliding-window layer's window (None: a global layer)
        shared = kwargs.pop("shared_prefix", None)
        if shared is not None:  # many rows over one shared cached prefix (see ripplekv.models.shared_prefix)
            if window is not None and shared.keys.shape[-2] + key.shape[-2] > window:
                raise SlidingWindowError(
                    f"the shared-prefix attention sees every prefix key, a sliding-window layer only the last "
                    f"{window}: profile such a sequence with the generic path (ripplekv.profiling.passes)"
                )
            return shared_prefix_attention(query, key, value, shared, kwargs.get("scaling")), None
        ragged = kwargs.pop("ragged_cache", None)
        if ragged is not None:  # caches of their own lengths, attended row by row (see ripplekv.models.padded)
            return _ragged_attention(module, query, ragged, kwargs.get("scaling"), window), None
        validity = kwargs.pop("key_validity", None)
        if validity is not None:  # a padded batch of compressed caches (see ripplekv.models.padded)
            mask = _validity_mask(module, validity, query, key)
            band = None if window is None else sliding_window_mask(query.shape[2], key.shape[2], window)
            if band is not None:  # sliding layers are whole in every row: the window counts from the end
                mask = mask.masked_fill(~band.to(mask.device), torch.finfo(mask.dtype).min)
        elif window is not None:  # a sliding layer is never compressed: the model's own sliding mask
            mask = _sliding_layer_mask(attention_mask, query.shape[2], key.shape[2], window, additive, query.dtype)
        else:
            mask = fit_attention_mask(attention_mask, query.shape[2], key.shape[2], additive, query.dtype)
        if mask is not None:
            mask = mask.to(query.device)
        if base_name == "sdpa" and query.device.type == "cpu" and getattr(module, "masked_key_indices", None) is None:
            return sdpa_gqa_forward(module, query, key, value, mask, **kwargs)
        # Resolved per call: a library that wraps the registered function (kvpress wraps every entry of
        # ALL_ATTENTION_FUNCTIONS for its head-wise masking, e.g. AdaKV) keeps working under the new name.
        base = ALL_ATTENTION_FUNCTIONS.get(base_name, default)
        return base(module, query, key, value, mask, **kwargs)

    return attention


# name -> (attention function, mask function, additive masks)
_BASES: dict[str, tuple[Callable, Callable, bool]] = {
    "sdpa": (sdpa_attention_forward, sdpa_mask, False),
    "eager": (eager_attention_forward, eager_mask, True),
}


def register_varlen_attention() -> None:
    """Register ``ripplekv_sdpa`` and ``ripplekv_eager`` with transformers (idempotent)."""
    for base_name, (attention, mask, additive) in _BASES.items():
        name = VARLEN_PREFIX + base_name
        if name not in AttentionInterface._global_mapping:
            AttentionInterface.register(name, _make_attention(base_name, attention, additive))
            AttentionMaskInterface.register(name, _make_mask(mask))


def varlen_name(attn_implementation: str) -> str:
    """The variable-length variant of an attention implementation name (``sdpa`` -> ``ripplekv_sdpa``)."""
    if attn_implementation.startswith(VARLEN_PREFIX):
        return attn_implementation
    if attn_implementation not in _BASES:
        raise ValueError(
            f"attention implementation {attn_implementation!r} has no variable-length variant; "
            f"use one of {sorted(_BASES)}"
        )
    return VARLEN_PREFIX + attn_implementation


def enable_varlen_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Switch ``model`` to the variable-length variant of its attention implementation, in place.

    Safe to call repeatedly; results are unchanged for uniform caches. Returns the model for chaining.
    """
    register_varlen_attention()
    current = model.config._attn_implementation or "eager"
    target = varlen_name(current)
    if current != target:
        model.set_attn_implementation(target)
    return model


def uses_varlen_attention(model: PreTrainedModel) -> bool:
    """Whether ``model`` attends correctly over caches whose layers differ in length."""
    return str(model.config._attn_implementation or "").startswith(VARLEN_PREFIX)
