"""Deriving a press's compressed cache from a prefill record, at the cost of its ``compress`` alone.

:func:`derive_cache` runs a press's ``compress`` on a :class:`~ripplekv_eval.fastpath.record.PrefillRecord` layer
by layer: the same tensors as a direct ``prefill(model, ids, press)`` (tested tensor for tensor). Head-wise masks
(AdaKV) move into the derived cache's layers (:func:`~ripplekv.models.headwise.take_mask`), so configurations
derived from one record never see each other's masks. Derived caches hold new tensors or the record's by reference.
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
from ripplekv.presses.score_memo import memoized
from ripplekv.presses.selection_window import check_prompt_length
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
    """Whether ``press`` does not opt out and keeps :class:`BasePress`'s ``forward_hook`` and ``__call__``.

    Then its whole effect on a prefill is what ``compress`` returns plus the head-wise masks it leaves; a per-prompt
    press (``derives_all_layers``) derives every layer itself. A class opts out with ``derivable_from_record = False``.
    :func:`derive_cache` also checks on every call that ``compress`` writes no recorded tensor, reads only recorded
    kwargs (all but ``past_key_values``) and no more hidden states than recorded.
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

    Calls ``press.post_init_from_model(model)`` first (RippleKV checks its profile there).

    Raises:
        NotDerivableError: for a press that cannot be derived (:func:`is_derivable`), or an invalidated record.
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

    Its ``seconds`` is the recorded prefill's plus the derivation's, what a direct prefill would report.
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
    """``prefill(model, input_ids, press)`` for a prompt of any length: recorded in chunks, the cache derived.

    kvpress compresses inside one pass, which would need the whole prompt's activations at once. This records in chunks
    of at most ``prefill_chunk`` tokens (None: one pass), keeping only what ``press`` reads, then derives its cache. A
    prompt within one chunk gives the direct prefill's result bit for bit (``seconds`` also count the derivation).

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
