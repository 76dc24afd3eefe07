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

Which implementations attend over per-layer caches (:func:`supports_per_layer_lengths`):

* ``sdpa`` and ``eager`` do not: transformers slices one mask, built from layer 0's length, for every layer, and
  stock sdpa's ``is_causal`` aligns a causal mask top-left (query ``i`` sees keys ``<= i``), not bottom-right
  (query ``i`` sees every cached key and the new keys up to itself). :func:`enable_varlen_attention` switches
  them to ``ripplekv_sdpa`` / ``ripplekv_eager``.
* ``flash_attention_2`` and ``flash_attention_3`` do, as loaded: FlashAttention (flash-attn >= 2.1) aligns its
  causal mask bottom-right on every call, over whatever keys the layer holds, and transformers' mask function for
  it returns ``None`` for an unpadded batch, which is also why kvpress runs per-layer presses under it. They are
  kept as the user loaded them. Three passes need ripplekv's own attention functions and are not served by
  FlashAttention: a padded batch over compressed caches (``key_validity``), the ragged batched decode
  (``ragged_cache``) and profiling's shared-prefix rows (``shared_prefix``); their callers fall back to exact
  paths (one cache at a time, :func:`ripplekv.profiling.passes.layer_by_layer`) under it
  (:func:`uses_varlen_attention` says whether a model runs ripplekv's functions).

Device placement: every mask is built on the device of the tensors it is combined with, once per layer and pass
at most, never copied between devices. A plain causal offset (new queries over a longer layer, no padding) is no
dense tensor at all: sdpa gets :func:`torch.nn.attention.bias.causal_lower_right`. The mask function makes no host
synchronisation on unpadded passes; a pass with a 2D ``attention_mask`` (padding) costs one per forward pass (is it
all ones, does layer 0 hold every position), as transformers' own sdpa mask does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from ripplekv.models.padded import KeyValidity, RaggedLayer
from ripplekv.models.shared_prefix import shared_prefix_attention

VARLEN_PREFIX = "ripplekv_"

NATIVE_PER_LAYER_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})
"""Implementations that attend over per-layer caches as loaded (bottom-right causal per call, no dense mask)."""

SUPPORTED_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
"""What to load a model with to compress it per layer (named in error messages)."""


class PaddedBatchError(ValueError):
    """A padded batch was used with a per-layer compressed cache (unsupported)."""


class SlidingWindowError(ValueError):
    """A pass that cannot serve a sliding-window layer beyond its window (the shared-prefix attention)."""


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


def _sliding_layer_mask(
    mask: torch.Tensor | None,
    query_len: int,
    key_len: int,
    window: int,
    additive: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | None:
    """A sliding layer's mask: the library's own when it was built for this layer's keys, else rebuilt.

    A mask built for another length was built from a compressed first layer, which :func:`varlen_mask` allows for
    unpadded batches only, so the rebuilt mask needs no padding.
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
            transformers skipped it (plain causal square) or because :func:`varlen_mask` left it to the layers.
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


def _plain_causal(kwargs: dict[str, Any]) -> bool:
    """Whether a pass's mask is plain causal: no padding, no custom mask function, no sliding window or chunk
    (transformers passes their size as ``local_size``)."""
    if kwargs.get("attention_mask") is not None or kwargs.get("use_vmap", False):
        return False
    return (
        kwargs.get("local_size") is None and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
    )


def _make_mask(base: Callable) -> Callable:
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
    """transformers' sdpa attention, bottom-right causal and without copying keys and values for GQA.

    Without a mask, a causal pass of ``q`` new queries over ``k > q`` keys (a question after a compressed context)
    gets :func:`torch.nn.attention.bias.causal_lower_right` (query ``i`` sees keys ``<= i + k - q``): no dense
    tensor, and torch picks a kernel that applies the offset itself where one exists (on the CPU and otherwise it
    materialises the boolean mask on the query's device). Stock sdpa would pass ``is_causal=True``, which aligns
    top-left. A causal square keeps ``is_causal``; one query attends to every key.

    transformers repeats the KV heads (a full copy of the layer's cache) whenever a mask is present, because
    some GPU kernels reject ``enable_gqa`` with a mask; on the CPU torch handles both together, and every
    multi-token pass over a cache (a question after the context, a profiling continuation) has a mask. This
    function therefore takes dense masks on the CPU only (:func:`_make_attention` routes the others to
    transformers); ``causal_lower_right`` is taken on every device (with ``enable_gqa``, torch's flash kernel
    attends the grouped heads itself and the other kernels expand them).
    """
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


def _validity_mask(
    module: torch.nn.Module, validity: KeyValidity, query: torch.Tensor, key: torch.Tensor
) -> torch.Tensor:
    """The mask of a pass over a padded batch of caches; it replaces the one transformers built for layer 0.

    One dense mask per layer and pass, inherent to the padded batch (each layer's rows see different entries),
    made on the device of the validity, i.e. of the cache (:func:`ripplekv.models.padded.pad_layers`).
    """
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
        mask = layer.row_mask(row, query_len, heads)  # on the row's buffers' device
        band = None if window is None else sliding_window_mask(query_len, keys.shape[2], window, device=keys.device)
        if band is not None:
            mask = band if mask is None else mask & band
        outputs.append(
            torch.nn.functional.scaled_dot_product_attention(
                query[row : row + 1],
                keys,
                values,
                attn_mask=mask,
                scale=scaling,
                is_causal=False,
                enable_gqa=heads != keys.shape[1],
            )
        )
    return torch.cat(outputs, dim=0).transpose(1, 2).contiguous()


def _make_attention(base_name: str, default: Callable, additive: bool) -> Callable:
    # The signature of transformers' attention functions, ``dropout`` the sixth positional parameter: kvpress wraps
    # every registered function when it is imported (``attention_patch``) and passes ``dropout`` by position, so a
    # function registered before kvpress is imported is called that way.
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
        ragged = kwargs.pop("ragged_cache", None)
        if ragged is not None:  # caches of their own lengths, attended row by row (see ripplekv.models.padded)
            return _ragged_attention(module, query, ragged, kwargs.get("scaling"), window), None
        validity = kwargs.pop("key_validity", None)
        masked = getattr(module, "masked_key_indices", None) is not None  # kvpress's head-wise wrapper is live
        beyond_window = window is not None and key.shape[2] > window
        if base_name == "sdpa" and validity is None and attention_mask is None and not masked and not beyond_window:
            return sdpa_gqa_forward(module, query, key, value, None, dropout, **kwargs)  # causal offset, no dense mask
        if validity is not None:  # a padded batch of compressed caches (see ripplekv.models.padded)
            mask = _validity_mask(module, validity, query, key)
            band = None
            if window is not None:
                band = sliding_window_mask(query.shape[2], key.shape[2], window, device=mask.device)
            if band is not None:  # sliding layers are whole in every row: the window counts from the end
                mask = mask.masked_fill(~band, torch.finfo(mask.dtype).min)
        elif window is not None:  # a sliding layer is never compressed: the model's own sliding mask
            mask = _sliding_layer_mask(
                attention_mask, query.shape[2], key.shape[2], window, additive, query.dtype, query.device
            )
        else:
            mask = fit_attention_mask(
                attention_mask, query.shape[2], key.shape[2], additive, query.dtype, device=query.device
            )
        if base_name == "sdpa" and query.device.type == "cpu" and not masked:
            return sdpa_gqa_forward(module, query, key, value, mask, dropout, **kwargs)
        # Resolved per call: a library that wraps the registered function (kvpress wraps every entry of
        # ALL_ATTENTION_FUNCTIONS for its head-wise masking, e.g. AdaKV) keeps working under the new name.
        base = ALL_ATTENTION_FUNCTIONS.get(base_name, default)
        return base(module, query, key, value, mask, dropout=dropout, **kwargs)

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

    Only these serve the passes that carry ``key_validity`` (a padded batch of compressed caches), ``ragged_cache``
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
