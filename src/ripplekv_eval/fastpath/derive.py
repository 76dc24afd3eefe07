"""Deriving a press's compressed cache from a prefill record, at the cost of its ``compress`` alone.

:func:`derived_prefill` (or :func:`derive_cache`) applies any derivable press to a
:class:`~ripplekv_eval.fastpath.record.PrefillRecord` layer by layer and builds the compressed cache from the results:
the same tensors a direct ``prefill(model, ids, press)`` produces (tested tensor for tensor).

Which presses are derivable (:func:`is_derivable`, checked again on every call):

1. the press keeps :class:`BasePress`'s ``forward_hook`` and ``__call__``: its whole effect on a prefill is
   to replace each layer's keys and values by what ``compress`` returns, plus the head-wise masks it leaves on
   the attention module (presses that override the hook or the context manager, e.g. decoding-time or composed
   presses, are not derivable); a press class may also declare ``derivable_from_record = False`` to opt out;
2. ``compress`` leaves the recorded tensors as they were (a press writing into them in place invalidates the
   record and raises :class:`NotDerivableError`);
3. ``compress`` only reads kwargs the record holds (everything the attention layer received except the live
   cache ``past_key_values`` and ``hidden_states``, which is recorded as its own field); reading another one
   raises :class:`NotDerivableError`;
4. ``compress`` reads no more of the hidden states than the record holds
   (:func:`~ripplekv_eval.fastpath.hidden_tail.hidden_states_needed`); else :class:`NotDerivableError` names the
   ``hidden_tail`` to record with.

Head-wise presses are derivable too. AdaKV keeps every key and sets kvpress's ``module.masked_key_indices``; right
after each layer's ``compress`` the mask is moved into the derived cache's layer
(:func:`~ripplekv.models.headwise.take_mask`), which the passes over that cache read. Configurations derived from
one record therefore never see each other's masks, and the modules are left without them.

FullPress, StreamingLLM, SnapKV, PyramidKV (kvpress's and the authors' schedule), AdaKV and RippleKV (any scorer)
are derivable. Every compressed cache derived from a record holds new tensors (``gather``) or, for layers a press
leaves whole (the full cache, AdaKV's masked layers), the record's own tensors by reference.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PreTrainedModel

from ripplekv.inference.generate import Prefill
from ripplekv.models.cache import cache_from_layers, dynamic_layer
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK
from ripplekv.models.headwise import discard_masks, take_mask
from ripplekv.presses.registry import check_prompt_length
from ripplekv.presses.score_memo import memoized
from ripplekv_eval.fastpath.hidden_tail import (
    DEFAULT_HIDDEN_TAIL,
    hidden_states_needed,
    hidden_states_tail,
    prescored_scorers,
)
from ripplekv_eval.fastpath.record import PrefillRecord, record_prefill, residual_statistics_of
from ripplekv_eval.fastpath.recording_press import LayerRecord

__all__ = [
    "NotDerivableError",
    "compressed_prefill_in_chunks",
    "derive_cache",
    "derived_prefill",
    "is_derivable",
]


class NotDerivableError(ValueError):
    """A press whose compressed cache cannot be derived from a prefill record (prefill with it directly)."""


class _RecordedKwargs(dict):
    """The recorded forward kwargs; reading one that was not recorded raises :class:`NotDerivableError`."""

    def __missing__(self, key: str) -> Any:
        raise NotDerivableError(f"compress reads kwargs[{key!r}], which a prefill record does not hold")


def is_derivable(press: BasePress) -> bool:
    """Static part of the rule (see the module docstring): default hook and context manager, no opt-out.

    :func:`derive_cache` also checks, on every call, that ``compress`` writes no recorded tensor and reads only
    recorded kwargs.
    """
    if not getattr(press, "derivable_from_record", True):
        return False
    if getattr(press, "derives_all_layers", False):  # a per-prompt press derives every layer at once (``derive``)
        return True
    cls = type(press)
    return cls.forward_hook is BasePress.forward_hook and cls.__call__ is BasePress.__call__


def _tensor_versions(layer: LayerRecord) -> list[int]:
    tensors = [layer.hidden_states, layer.keys, layer.values]
    if layer.attentions is not None:
        tensors.append(layer.attentions)
    return [t._version for t in tensors]


@torch.no_grad()
def derive_cache(record: PrefillRecord, press: BasePress) -> DynamicCache:
    """The cache ``prefill(model, ids, press)`` would have built, head-wise masks (AdaKV) in its layers.

    Calls ``press.post_init_from_model(model)`` first (RippleKV checks its profile there), then
    ``press.compress`` layer by layer on the recorded inputs. Raises :class:`NotDerivableError` for a press that
    cannot be derived (see the module docstring).

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    if record.invalid is not None:
        raise NotDerivableError(f"the prefill record is no longer valid: {record.invalid}")
    if not is_derivable(press):
        raise NotDerivableError(
            f"{type(press).__name__} overrides the kvpress forward hook or context manager (or opts out): "
            "its cache cannot be derived from a prefill record"
        )
    check_prompt_length(press, record.prompt_tokens)
    held = record.hidden_tokens
    if held < record.prompt_tokens:
        need = hidden_states_needed(press, record.prescored)
        if need is None or need > held:
            reads = "every prompt position" if need is None else f"the last {need} prompt positions"
            raise NotDerivableError(
                f"{type(press).__name__} reads {reads} of the hidden states, but the record holds the last {held} of "
                f"{record.prompt_tokens} (record_prefill keeps the last {DEFAULT_HIDDEN_TAIL} by default): record with "
                "record_prefill(..., hidden_tail=hidden_states_tail(presses)) over every press to derive, or "
                "hidden_tail=None to keep them all"
            )
    press.post_init_from_model(record.model)
    with memoized(record.memo):  # a scorer's scores (a rule's statistics) computed once per record
        return _derive(record, press)


def _derive(record: PrefillRecord, press: BasePress) -> DynamicCache:
    modules = [layer.module for layer in record.layers]
    discard_masks(modules)
    if getattr(press, "derives_all_layers", False):  # statistics of every layer first, then every layer's budget
        versions = [_tensor_versions(layer) for layer in record.layers]
        try:
            pairs = press.derive(record.layers, record.model.config)
        except BaseException:
            discard_masks(modules)
            raise
        layers = [take_mask(module, dynamic_layer(*pair)) for module, pair in zip(modules, pairs, strict=True)]
        if [_tensor_versions(layer) for layer in record.layers] != versions:
            record.invalid = f"{type(press).__name__}.derive wrote into the recorded tensors in place"
            raise NotDerivableError(record.invalid)
        return cache_from_layers(layers)
    layers = []
    for layer in record.layers:
        versions = _tensor_versions(layer)
        kwargs = _RecordedKwargs(layer.kwargs)
        try:
            keys, values = press.compress(
                layer.module, layer.hidden_states, layer.keys, layer.values, layer.attentions, kwargs
            )
        except BaseException:
            discard_masks([layer.module])
            raise
        layers.append(take_mask(layer.module, dynamic_layer(keys, values)))
        if _tensor_versions(layer) != versions:
            record.invalid = f"{type(press).__name__}.compress wrote into the recorded tensors in place"
            raise NotDerivableError(record.invalid)
    return cache_from_layers(layers)


def derived_prefill(record: PrefillRecord, press: BasePress) -> tuple[Prefill, float]:
    """A :class:`Prefill` over the cache derived for ``press``, and the seconds the derivation took.

    Works for every press of :func:`ripplekv.presses.make_press`, AdaKV included (its masks held by the cache's
    layers). Its ``seconds`` is the recorded prefill's time plus the derivation's, what a direct prefill would
    report.

    Args:
        record: the recorded full prefill.
        press: the press to derive a cache for.
    """
    start = time.perf_counter()
    cache = derive_cache(record, press)
    seconds = time.perf_counter() - start
    prefill_state = Prefill(cache, record.next_logits, record.prompt_tokens, record.seconds + seconds)
    return prefill_state, seconds


def compressed_prefill_in_chunks(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    press: BasePress,
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
) -> Prefill:
    """``prefill(model, input_ids, press)`` for a prompt of any length: recorded in chunks, the press's cache derived.

    kvpress compresses inside one pass, so a long prompt under a press would need the whole prompt's activations at
    once. This records it in chunks of at most ``prefill_chunk`` tokens, keeping only what ``press`` reads (the
    hidden-state tail of :func:`~ripplekv_eval.fastpath.hidden_tail.hidden_states_tail`, its residual statistics,
    ExpectedAttention prescored), and derives its cache: the prefill holds one chunk's activations over the full cache,
    then the full cache and the compressed one until the record is released on return. A prompt within the chunk is one
    pass, and the result is then the direct prefill's bit for bit (its ``seconds`` also count the derivation).

    Args:
        model: the model.
        input_ids: the prompt, one unpadded sequence of shape ``(1, n)``.
        press: any derivable press (:func:`is_derivable`; every press of :func:`ripplekv.presses.make_press`).
        prefill_chunk: most tokens per prefill pass (default
            :data:`~ripplekv.models.chunked_prefill.DEFAULT_PREFILL_CHUNK`); None: one pass.

    Raises:
        NotDerivableError: for a press whose cache cannot be derived from a record.
    """
    if not is_derivable(press):
        raise NotDerivableError(
            f"{type(press).__name__} overrides the kvpress forward hook or context manager (or opts out): it cannot "
            "be prefilled in chunks; prefill it in one pass (ripplekv.inference.generate.prefill)"
        )
    presses = [press]
    prescore = prescored_scorers(presses)
    tail = hidden_states_tail(presses, prescore)
    record = record_prefill(model, input_ids, tail, residual_statistics_of(presses), prefill_chunk, prescore)
    state, _ = derived_prefill(record, press)
    return state
