"""Which attention implementation a model runs over KV caches whose layers hold different numbers of tokens.

transformers sizes one mask per pass from layer 0, so a multi-token pass over a per-layer compressed cache fails
with a shape error or, worse, stock sdpa's ``is_causal`` aligns top-left. ``ripplekv_sdpa`` / ``ripplekv_eager``,
registered through transformers' public ``AttentionInterface`` (nothing patched), fit the mask per layer
(:mod:`ripplekv.models.attention_masks`) and equal ``sdpa`` / ``eager`` on uniform caches. FlashAttention
(flash-attn >= 2.1) aligns bottom-right per call and is kept as loaded, but cannot serve ``key_validity``, ragged
caches or ``shared_prefix``; callers then take exact per-cache paths.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

from ripplekv.models.attention_functions import CACHE_KWARG, varlen_attention_function
from ripplekv.models.attention_masks import varlen_mask_function
from ripplekv.models.headwise import MASKED_KEYS, attention_modules, headwise_of

VARLEN_PREFIX = "ripplekv_"

NATIVE_PER_LAYER_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})
"""Implementations that attend over per-layer caches as loaded (bottom-right causal per call, no dense mask)."""

# name -> (attention function, mask function, additive masks)
_BASES = {"sdpa": (sdpa_attention_forward, sdpa_mask, False), "eager": (eager_attention_forward, eager_mask, True)}


def varlen_name(attn_implementation: str) -> str:
    """The variable-length variant of an attention implementation name (``sdpa`` -> ``ripplekv_sdpa``); registers
    ``ripplekv_sdpa`` and ``ripplekv_eager``.

    Raises:
        ValueError: FlashAttention needs no variant; other implementations cannot attend over per-layer caches.
    """
    base = attn_implementation.removeprefix(VARLEN_PREFIX)
    if base in NATIVE_PER_LAYER_ATTENTION:
        raise ValueError(
            f"{base!r} attends over per-layer compressed caches as it is and has no ripplekv "
            "variant; keep it (enable_varlen_attention leaves it unchanged)"
        )
    if base not in _BASES:
        raise ValueError(
            f"attention implementation {base!r} cannot attend over per-layer compressed KV caches: "
            "load the model with attn_implementation set to one of 'sdpa', 'eager', 'flash_attention_2'"
        )
    for name, (attention, mask, additive) in _BASES.items():  # both, once per process
        if VARLEN_PREFIX + name not in AttentionInterface._global_mapping:
            AttentionInterface.register(VARLEN_PREFIX + name, varlen_attention_function(name, attention, additive))
            AttentionMaskInterface.register(VARLEN_PREFIX + name, varlen_mask_function(mask))
    return VARLEN_PREFIX + base


def attention_implementation(model: PreTrainedModel) -> str:
    """The attention implementation ``model`` runs (``config._attn_implementation``; ``eager`` when unset)."""
    return str(model.config._attn_implementation or "eager")


def enable_varlen_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Make ``model`` attend correctly over per-layer compressed caches, in place (idempotent); returns it:
    ``sdpa`` / ``eager`` become ``ripplekv_sdpa`` / ``ripplekv_eager``, FlashAttention is kept, others raise. Every
    pass then reads the head-wise masks of the cache it runs over (:func:`read_cache_masks`)."""
    current = attention_implementation(model)
    if current not in NATIVE_PER_LAYER_ATTENTION:
        target = varlen_name(current)  # registered in this process
        if target != current:
            model.set_attn_implementation(target)
    return read_cache_masks(model)


class HeadwiseMaskError(ValueError):
    """A pass over a head-wise masked cache layer whose attention implementation would not read the masks."""


def hand_cache_to_attention(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
    """An attention module's forward pre-hook: the pass's cache (``past_key_values``) handed on to ripplekv's
    attention functions as :data:`CACHE_KWARG`; a pass over a masked layer that the implementation would attend
    unmasked raises :class:`HeadwiseMaskError` naming what to call."""
    cache = kwargs.get("past_key_values")
    if cache is None:
        return None
    implementation = str(module.config._attn_implementation)
    if implementation.startswith(VARLEN_PREFIX):
        return args, {**kwargs, CACHE_KWARG: cache}
    index = module.layer_idx
    mask = headwise_of(cache.layers[index]) if index < len(cache.layers) else None
    if mask is None:
        return None
    if implementation in NATIVE_PER_LAYER_ATTENTION:
        if getattr(module, MASKED_KEYS, None) is mask.indices:  # handed to kvpress's wrapper for this pass
            return None
        raise HeadwiseMaskError(
            f"layer {index} of the cache hides entries head by head (AdaKV), which {implementation!r} reads only "
            "through ripplekv.inference.generate.cache_forward (greedy_decode, extend): run the pass with it, or "
            "load the model with attn_implementation='sdpa'"
        )
    raise HeadwiseMaskError(
        f"layer {index} of the cache hides entries head by head (AdaKV), which attention implementation "
        f"{implementation!r} would attend to: call ripplekv.models.attention.enable_varlen_attention(model) first "
        "(sdpa becomes ripplekv_sdpa, which reads the masks)"
    )


def read_cache_masks(model: PreTrainedModel) -> PreTrainedModel:
    """Make every attention pass of ``model`` read the head-wise masks of the cache layer it runs over, however the
    model is called (``model(...)``, ``generate``, ``cache_forward``), or raise :class:`HeadwiseMaskError`; in place
    (idempotent), returns it. A forward pre-hook on each attention module hands the pass's cache on to ripplekv's
    attention functions (:data:`CACHE_KWARG`)."""
    for module in attention_modules(model):
        if hand_cache_to_attention not in module._forward_pre_hooks.values():
            module.register_forward_pre_hook(hand_cache_to_attention, with_kwargs=True)
    return model


def supports_per_layer_lengths(model: PreTrainedModel) -> bool:
    """Whether ``model`` attends correctly over caches whose layers differ in length (ripplekv's or FlashAttention)."""
    return uses_varlen_attention(model) or attends_per_layer_natively(model)


def attends_per_layer_natively(model: PreTrainedModel) -> bool:
    """Whether ``model`` runs FlashAttention, which attends over per-layer caches as loaded but takes no dense mask."""
    return attention_implementation(model) in NATIVE_PER_LAYER_ATTENTION


def uses_varlen_attention(model: PreTrainedModel) -> bool:
    """Whether ``model`` runs ``ripplekv_sdpa`` / ``ripplekv_eager``, the only readers of ``key_validity``, ragged
    caches and ``shared_prefix``."""
    return attention_implementation(model).startswith(VARLEN_PREFIX)


def unsupported_implementation_message(model: PreTrainedModel, what: str) -> str:
    """An error message: ``what`` (e.g. ``"batched decoding"``) needs ripplekv's attention functions."""
    return (
        f"{what} runs through ripplekv's attention functions, which attention implementation "
        f"{attention_implementation(model)!r} does not use: load the model with attn_implementation='sdpa' (or "
        "'eager') and call ripplekv.models.attention.enable_varlen_attention(model)"
    )
