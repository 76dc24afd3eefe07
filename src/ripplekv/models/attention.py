"""Attention over KV caches whose layers hold different numbers of tokens.

After per-layer compression (RippleKV, PyramidKV, ...) layer ``l`` of the cache holds ``n_l`` tokens, but
transformers builds one attention mask per forward pass, sized from layer 0 (``kv_len = n_0 + q_len``).
Single-token decoding survives because sdpa needs no mask for one query, yet any multi-token pass over the
compressed cache (a question appended after the context, a teacher-forced continuation) fails with a shape
error, or, worse, silently uses ``is_causal=True`` with top-left alignment.

The fix lives at the one place that knows both lengths, the attention function: the mask built for layer 0 is
fitted to each layer's own key length (:mod:`ripplekv.models.attention_masks`, sliding-window layers included), and
the attention functions (:mod:`ripplekv.models.attention_functions`) serve the passes over padded and ragged batches
of compressed caches and over a shared prefix. This module's one concern is which implementation a model runs:
registering ripplekv's, switching a model to them, and saying whether a model can attend over per-layer caches.

The functions are registered under new names through transformers' public ``AttentionInterface`` and
``AttentionMaskInterface`` (nothing of the library is patched): ``ripplekv_sdpa`` and ``ripplekv_eager``.
When every layer has the same length they compute exactly what ``sdpa`` and ``eager`` compute.

Which implementations attend over per-layer caches (:func:`supports_per_layer_lengths`):

* ``sdpa`` and ``eager`` do not: transformers slices one mask, built from layer 0's length, for every layer, and
  stock sdpa's ``is_causal`` aligns a causal mask top-left (query ``i`` sees keys ``<= i``), not bottom-right
  (query ``i`` sees every cached key and the new keys up to itself). :func:`enable_varlen_attention` switches
  them to ``ripplekv_sdpa`` / ``ripplekv_eager``.
* ``flash_attention_2`` and ``flash_attention_3`` do, as loaded: FlashAttention (flash-attn >= 2.1) aligns its
  causal mask bottom-right on every call, over whatever keys the layer holds, and transformers' mask function for
  it returns ``None`` for an unpadded batch, which is also why kvpress runs per-layer presses under it. They are
  kept as the user loaded them. Three passes need ripplekv's own attention functions and are not served by
  FlashAttention: a padded batch over compressed caches (``key_validity``), the ragged batched decode (a cache of
  :class:`~ripplekv.models.padded.RaggedLayer`) and profiling's shared-prefix rows (``shared_prefix``); their callers
  fall back to exact paths (one cache at a time, :func:`ripplekv.profiling.passes.layer_by_layer`) under it
  (:func:`uses_varlen_attention` says whether a model runs ripplekv's functions). Head-wise masked caches (AdaKV)
  run under it through kvpress's fake keys (:func:`ripplekv.inference.generate.cache_forward`).
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.models.llama.modeling_llama import eager_attention_forward

from ripplekv.models.attention_functions import (
    CACHE_KWARG,
    SlidingWindowError,
    sdpa_gqa_forward,
    varlen_attention_function,
)
from ripplekv.models.attention_masks import (
    PaddedBatchError,
    fit_attention_mask,
    sliding_window_mask,
    varlen_mask_function,
)

__all__ = [
    "NATIVE_PER_LAYER_ATTENTION",
    "SUPPORTED_IMPLEMENTATIONS",
    "VARLEN_PREFIX",
    "attends_per_layer_natively",
    "attention_implementation",
    "enable_varlen_attention",
    "register_varlen_attention",
    "supports_per_layer_lengths",
    "unsupported_implementation_message",
    "uses_varlen_attention",
    "varlen_name",
    # re-exported, imported from here across the package: the masks and the attention functions
    "CACHE_KWARG",
    "PaddedBatchError",
    "SlidingWindowError",
    "fit_attention_mask",
    "sdpa_gqa_forward",
    "sliding_window_mask",
]

VARLEN_PREFIX = "ripplekv_"

NATIVE_PER_LAYER_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})
"""Implementations that attend over per-layer caches as loaded (bottom-right causal per call, no dense mask)."""

SUPPORTED_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
"""What to load a model with to compress it per layer (named in error messages)."""


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
            AttentionInterface.register(name, varlen_attention_function(base_name, attention, additive))
            AttentionMaskInterface.register(name, varlen_mask_function(mask))


def _unsupported(attn_implementation: str) -> str:
    return (
        f"attention implementation {attn_implementation!r} cannot attend over per-layer compressed KV caches: "
        f"load the model with attn_implementation set to one of {', '.join(map(repr, SUPPORTED_IMPLEMENTATIONS))}"
    )


def varlen_name(attn_implementation: str) -> str:
    """The variable-length variant of an attention implementation name (``sdpa`` -> ``ripplekv_sdpa``).

    Raises:
        ValueError: the implementation has no variant: FlashAttention needs none (see
            :func:`supports_per_layer_lengths`), others cannot attend over per-layer caches.
    """
    if attn_implementation.startswith(VARLEN_PREFIX):
        return attn_implementation
    if attn_implementation in NATIVE_PER_LAYER_ATTENTION:
        raise ValueError(
            f"{attn_implementation!r} attends over per-layer compressed caches as it is and has no ripplekv "
            "variant; keep it (enable_varlen_attention leaves it unchanged)"
        )
    if attn_implementation not in _BASES:
        raise ValueError(_unsupported(attn_implementation))
    return VARLEN_PREFIX + attn_implementation


def attention_implementation(model: PreTrainedModel) -> str:
    """The attention implementation ``model`` runs (``config._attn_implementation``; ``eager`` when unset)."""
    return str(model.config._attn_implementation or "eager")


def enable_varlen_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Make ``model`` attend correctly over per-layer compressed caches, in place; returns it for chaining.

    ``sdpa`` and ``eager`` are switched to ``ripplekv_sdpa`` / ``ripplekv_eager``: stock sdpa aligns its causal mask
    top-left and both slice the one mask built from layer 0's length for every layer, which is wrong over caches
    whose layers hold different numbers of tokens. ``flash_attention_2`` / ``flash_attention_3`` are kept as
    loaded: they attend bottom-right causally over each layer's own keys already (see the module docstring).
    Safe to call repeatedly; results are unchanged for uniform caches.

    Raises:
        ValueError: the implementation can do neither (the message names the implementations to load).
    """
    register_varlen_attention()
    current = attention_implementation(model)
    if current in NATIVE_PER_LAYER_ATTENTION:
        return model
    target = varlen_name(current)
    if current != target:
        model.set_attn_implementation(target)
    return model


def supports_per_layer_lengths(model: PreTrainedModel) -> bool:
    """Whether ``model`` attends correctly over caches whose layers differ in length.

    True for ripplekv's variants (``ripplekv_sdpa``, ``ripplekv_eager``) and for FlashAttention
    (``flash_attention_2``, ``flash_attention_3``), which does natively; False for stock ``sdpa`` and ``eager``
    (:func:`enable_varlen_attention` switches those) and anything else.
    """
    return uses_varlen_attention(model) or attends_per_layer_natively(model)


def attends_per_layer_natively(model: PreTrainedModel) -> bool:
    """Whether ``model`` runs an implementation that attends over per-layer caches as loaded (FlashAttention).

    Such an implementation takes no dense attention mask: passes that need one of ripplekv's (padded batches of
    compressed caches, head-wise masks as a boolean mask) use another way under it or refuse to run.
    """
    return attention_implementation(model) in NATIVE_PER_LAYER_ATTENTION


def uses_varlen_attention(model: PreTrainedModel) -> bool:
    """Whether ``model`` runs ripplekv's own attention functions (``ripplekv_sdpa`` / ``ripplekv_eager``).

    Only these serve the passes that carry ``key_validity`` (a padded batch of compressed caches), a ragged cache
    (batched decoding) or ``shared_prefix`` (profiling's fast path). Whether a model can attend over per-layer
    caches at all is :func:`supports_per_layer_lengths`.
    """
    return attention_implementation(model).startswith(VARLEN_PREFIX)


def unsupported_implementation_message(model: PreTrainedModel, what: str) -> str:
    """An error message: ``what`` needs ripplekv's attention functions, which ``model`` does not run.

    Args:
        model: the model.
        what: the pass that cannot run, e.g. ``"batched decoding"``.
    """
    return (
        f"{what} runs through ripplekv's attention functions, which attention implementation "
        f"{attention_implementation(model)!r} does not use: load the model with attn_implementation='sdpa' (or "
        "'eager') and call ripplekv.models.attention.enable_varlen_attention(model)"
    )
