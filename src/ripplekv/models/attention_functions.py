"""The attention functions registered as ``ripplekv_sdpa`` and ``ripplekv_eager``: exactly ``sdpa`` and ``eager``
on uniform caches. A pass carries its cache (:data:`CACHE_KWARG`, handed on by the attention modules' pre-hook,
:func:`ripplekv.models.attention.read_cache_masks`) and the layer decides: a layer with an ``attend(module, query,
scaling, window)`` method attends itself (the harness's ragged batches), a ``MaskedLayer`` excludes its masked
entries, any other layer gets its mask fitted. A ``key_validity`` keyword (the harness's padded batches) gives the
mask through its ``additive_mask(module, query, key)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ripplekv.models.attention_masks import fit_attention_mask, sliding_layer_mask, sliding_window_mask
from ripplekv.models.headwise import MASKED_KEYS, headwise_of
from ripplekv.models.shared_prefix import shared_prefix_attention

CACHE_KWARG = "ripplekv_cache"
"""The keyword argument that carries a pass's cache from its attention module to ripplekv's attention functions."""


class SlidingWindowError(ValueError):
    """A pass that cannot serve a sliding-window layer beyond its window (the shared-prefix attention)."""


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
    """transformers' sdpa attention, bottom-right causal (``causal_lower_right``, no dense tensor; stock sdpa's
    ``is_causal`` aligns top-left) and without copying keys and values for GQA (transformers repeats the KV heads
    whenever a mask is present, as some GPU kernels reject ``enable_gqa`` with one: dense masks come here on CPU)."""
    groups = query.shape[1] // key.shape[1]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    query_len, key_len = query.shape[2], key.shape[2]
    mask: Any = attention_mask
    square = False
    if attention_mask is None and causal and query_len > 1:
        if query_len == key_len:
            square = True
        else:
            mask = causal_lower_right(query_len, key_len)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=square,
        enable_gqa=groups > 1,
    )
    return out.transpose(1, 2).contiguous(), None


def varlen_attention_function(base_name: str, default: Callable, additive: bool) -> Callable:
    """The attention function registered as ``ripplekv_<base_name>`` (``sdpa`` or ``eager``).

    ``base_name`` is looked up in ``ALL_ATTENTION_FUNCTIONS`` on every call (``default`` when absent);
    ``additive``: the implementation takes float masks (eager) rather than boolean ones (sdpa).
    """

    # ``dropout`` sixth positional: kvpress wraps every registered function and passes it by position.
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
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
        cache = kwargs.pop(CACHE_KWARG, None)
        layer = None if cache is None else cache.layers[module.layer_idx]
        attend = getattr(layer, "attend", None)
        if attend is not None:  # a layer that attends itself (the harness's RaggedLayer: row by row)
            return attend(module, query, kwargs.get("scaling"), window), None
        headwise = headwise_of(layer)
        if headwise is not None:  # the layer's head-wise masked entries (AdaKV), excluded exactly
            if window is not None or additive:
                raise ValueError(
                    "head-wise masked keys (AdaKV) need sdpa attention over a global layer, not eager attention "
                    "or a sliding-window layer"
                )
            attention_mask = headwise.attention_mask(
                attention_mask, query.shape[1], query.shape[2], key.shape[2], query.device
            )
        validity = kwargs.pop("key_validity", None)
        masked = getattr(module, MASKED_KEYS, None) is not None  # a press used directly: kvpress's wrapper masks
        beyond_window = window is not None and key.shape[2] > window
        if base_name == "sdpa" and validity is None and attention_mask is None and not masked and not beyond_window:
            return sdpa_gqa_forward(module, query, key, value, None, dropout, **kwargs)  # causal offset, no dense mask
        if validity is not None:  # a padded batch of compressed caches (the harness's KeyValidity)
            if not callable(getattr(validity, "additive_mask", None)):
                raise TypeError(f"key_validity must have an additive_mask method, got {type(validity).__name__}")
            mask = validity.additive_mask(module, query, key)
            band = None
            if window is not None:
                band = sliding_window_mask(query.shape[2], key.shape[2], window, device=mask.device)
            if band is not None:  # sliding layers are whole in every row: the window counts from the end
                mask = mask.masked_fill(~band, torch.finfo(mask.dtype).min)
        elif window is not None:  # a sliding layer is never compressed: the model's own sliding mask
            mask = sliding_layer_mask(
                attention_mask, query.shape[2], key.shape[2], window, additive, query.dtype, query.device
            )
        else:
            mask = fit_attention_mask(
                attention_mask, query.shape[2], key.shape[2], additive, query.dtype, device=query.device
            )
        if base_name == "sdpa" and query.device.type == "cpu" and not masked:
            return sdpa_gqa_forward(module, query, key, value, mask, dropout, **kwargs)
        # Resolved per call, so a wrapper of the registered function (kvpress's, for AdaKV) keeps working.
        base = ALL_ATTENTION_FUNCTIONS.get(base_name, default)
        return base(module, query, key, value, mask, dropout=dropout, **kwargs)

    return attention
