"""Deriving a press's compressed cache from a prefill record at the cost of its ``compress`` alone: the tensors of a
direct ``prefill(model, ids, press)`` (tested). Head-wise masks (AdaKV) live in the derived cache's layers (a press's
``compress`` writes them into the cache it is handed, kvpress's own are moved there), so derivations never see each
other's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ripplekv.allocation.per_prompt import TokenStatistic
from ripplekv.inference.generate import Prefill, prefill
from ripplekv.models.attention import read_cache_masks
from ripplekv.models.cache import cache_from_layers, dynamic_layer
from ripplekv.models.chunked_prefill import DEFAULT_PREFILL_CHUNK
from ripplekv.models.headwise import discard_masks, take_mask
from ripplekv.models.layer_types import compressed_layers
from ripplekv.presses.per_prompt_press import PerPromptBudgetPress
from ripplekv.presses.selection_window import check_compressible, check_prompt_length
from ripplekv_eval.fastpath.hidden_tail import (
    DEFAULT_HIDDEN_TAIL,
    PER_PROMPT,
    hidden_states_needed,
    hidden_states_tail,
    is_derivable,
    prescored_scorers,
)
from ripplekv_eval.fastpath.record import PrefillRecord, record_prefill
from ripplekv_eval.fastpath.recording_press import LayerRecord
from ripplekv_eval.fastpath.score_memo import ScoreMemo, memoizing


class NotDerivableError(ValueError):
    """A press whose compressed cache cannot be derived from a prefill record (prefill with it directly)."""


class _RecordedKwargs(dict):
    """The recorded forward kwargs; reading one that was not recorded raises :class:`NotDerivableError`."""

    def __missing__(self, key: str) -> Any:
        raise NotDerivableError(f"compress reads kwargs[{key!r}], which a prefill record does not hold")


def _tensor_versions(layer: LayerRecord) -> list[int]:
    tensors = [layer.hidden_states, layer.keys, layer.values]
    if layer.attentions is not None:
        tensors.append(layer.attentions)
    return [t._version for t in tensors]


@torch.no_grad()
def derive_cache(record: PrefillRecord, press: BasePress) -> DynamicCache:
    """The cache ``prefill(model, ids, press)`` would have built, head-wise masks (AdaKV) in its layers.

    Checks that ``compress`` writes no recorded tensor and reads only recorded kwargs; NotDerivableError for a press
    the fast path does not derive, one reading more hidden states than recorded, or an invalidated record.
    """
    if record.invalid is not None:
        raise NotDerivableError(f"the prefill record is no longer valid: {record.invalid}")
    if not is_derivable(press):
        raise NotDerivableError(
            f"the fast path does not know {type(press).__name__} or a press it wraps (exact classes only): its cache "
            "cannot be derived from a prefill record; prefill it directly (compressed_prefill does)"
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
    press.post_init_from_model(read_cache_masks(record.model))
    return _derive(record, press)


def _derive(record: PrefillRecord, press: BasePress) -> DynamicCache:
    modules = [layer.module for layer in record.layers]
    versions = [_tensor_versions(layer) for layer in record.layers]
    discard_masks(modules)
    try:
        if type(press) in PER_PROMPT:  # statistics of every layer first, then every layer's budget
            layers = derive_per_prompt(press, record.layers, record.model.config, record.memo)  # type: ignore[arg-type]
        else:
            layers = _compress_layers(memoizing(press, record.memo), record.layers)  # scores once per record
    except BaseException:
        discard_masks(modules)
        raise
    if [_tensor_versions(layer) for layer in record.layers] != versions:
        record.invalid = f"deriving {type(press).__name__} wrote into the recorded tensors in place"
        raise NotDerivableError(record.invalid)
    return cache_from_layers(layers)


class _LayerSink:
    """The ``past_key_values`` a derivation hands ``compress``: a press may write its layer into ``layers[index]``
    (ripplekv's head-wise presses write their masked layers), but reading a layer of the live cache, which a prefill
    record does not hold, raises :class:`NotDerivableError`."""

    def __init__(self) -> None:
        self.written: dict[int, DynamicLayer] = {}

    @property
    def layers(self) -> _LayerSink:
        return self

    def __setitem__(self, index: int, layer: DynamicLayer) -> None:
        self.written[index] = layer

    def __getitem__(self, index: int) -> Any:
        raise NotDerivableError("compress reads kwargs['past_key_values'].layers, which a prefill record does not hold")


def _compress_layers(press: BasePress, layers: Sequence[LayerRecord]) -> list[DynamicLayer]:
    """Every recorded layer compressed by ``press``: the layer its ``compress`` writes into the pass's cache, else
    one of the keys and values it returns, holding the head-wise mask kvpress's own presses (``AdaKVPress``) leave
    on the attention module."""
    out = []
    for index, layer in enumerate(layers):
        sink = _LayerSink()
        kwargs = _RecordedKwargs({**layer.kwargs, "past_key_values": sink})
        pair = press.compress(layer.module, layer.hidden_states, layer.keys, layer.values, layer.attentions, kwargs)
        written = sink.written.get(index)
        out.append(take_mask(layer.module, dynamic_layer(*pair) if written is None else written))
    return out


def derived_prefill(record: PrefillRecord, press: BasePress) -> tuple[Prefill, float]:
    """A :class:`Prefill` over the cache derived for ``press`` (``seconds``: the record's plus the derivation's), and
    the derivation's seconds."""
    start = time.perf_counter()
    cache = derive_cache(record, press)
    seconds = time.perf_counter() - start
    return Prefill(cache, record.next_logits, record.prompt_tokens, record.seconds + seconds), seconds


def compressed_prefill(record: PrefillRecord, press: BasePress) -> Prefill:
    """``press``'s compressed prefill of ``record``'s prompt: derived from the record when the fast path derives it
    (:func:`~ripplekv_eval.fastpath.hidden_tail.is_derivable`), else the press's own one-pass prefill."""
    if is_derivable(press):
        return derived_prefill(record, press)[0]
    return prefill(record.model, record.input_ids, press)


def compressed_prefill_in_chunks(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    press: BasePress,
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
) -> Prefill:
    """``prefill(model, input_ids, press)`` for a prompt of any length: recorded in chunks of ``prefill_chunk``
    tokens (None: one pass), keeping only what ``press`` reads, then derived (bit for bit within one chunk)."""
    if not is_derivable(press):
        raise NotDerivableError(
            f"the fast path does not know {type(press).__name__} or a press it wraps (exact classes only): it cannot "
            "be prefilled in chunks; prefill it in one pass (ripplekv.inference.generate.prefill)"
        )
    presses = [press]
    prescore = prescored_scorers(presses)
    tail = hidden_states_tail(presses, prescore)
    record = record_prefill(model, input_ids, tail, residual_statistics_of(presses), prefill_chunk, prescore)
    state, _ = derived_prefill(record, press)
    return state


def recorded_statistics(
    press: PerPromptBudgetPress, layers: Sequence[LayerRecord], config: PretrainedConfig, memo: ScoreMemo
) -> list[Any]:
    """The rule's statistic of every compressed layer of a record: memoised per rule and window, or recorded while
    the prefill ran (the residual stream's rules, :func:`residual_statistics_of`)."""
    rule = press.schedule.rule  # type: ignore[union-attr]
    stats = []
    for index in compressed_layers(config):
        layer = layers[index]
        check_compressible(press, layer.kwargs, layer.keys.shape[2], press.statistic_window)  # type: ignore[arg-type]
        if press.needs_residual:
            if rule.name not in layer.statistics:
                raise ValueError(f"the prefill record holds no {rule.name} statistic: record it (see record_prefill)")
            stats.append(layer.statistics[rule.name])
            continue

        def compute(layer: LayerRecord = layer) -> Any:
            return press.layer_statistic(layer.module, layer.hidden_states, layer.keys, layer.values, layer.kwargs)

        key = (repr(rule), press.statistic_window, press.window_size)
        stats.append(memo.get("statistic", key, index, layer.keys, compute))
    return stats


def derive_per_prompt(
    press: PerPromptBudgetPress, layers: Sequence[LayerRecord], config: PretrainedConfig, memo: ScoreMemo
) -> list[DynamicLayer]:
    """Every layer's cache layer pruned from a prefill record's layers (LAVa's head-wise masked ones included)."""
    compressed = compressed_layers(config)
    stats = recorded_statistics(press, layers, config, memo)
    scores = {}
    for index in compressed:
        layer = layers[index]
        scores[index] = memo.scores(
            press.press,
            layer.module,
            layer.hidden_states,
            layer.keys,
            layer.values,
            layer.attentions,
            dict(layer.kwargs),
        )
    budgets = press.budgets(stats, config, layers[compressed[0]].keys.shape[2])
    return [
        press.prune(layer.keys, layer.values, scores[index], budgets[index], config)
        if index in budgets
        else dynamic_layer(layer.keys, layer.values)
        for index, layer in enumerate(layers)
    ]


def residual_statistics_of(presses: Iterable[BasePress]) -> dict[str, Callable[[torch.Tensor, torch.Tensor], Any]]:
    """Per rule name, the residual-stream statistic a record computes to derive ``presses``: the rule's
    ``layer_statistic``, or a :class:`~ripplekv.allocation.per_prompt.TokenStatistic` where the rule reduces per-token
    values (a chunked prefill accumulates them)."""
    found: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {}
    for press in presses:
        if type(press) not in PER_PROMPT or not press.needs_residual:  # type: ignore[attr-defined]
            continue
        rule = press.schedule.rule  # type: ignore[attr-defined]
        per_token = getattr(rule, "token_statistic", None)
        reduce = getattr(rule, "statistic_from_tokens", None)
        whole = rule.layer_statistic
        found[rule.name] = whole if per_token is None or reduce is None else TokenStatistic(whole, per_token, reduce)
    return found
