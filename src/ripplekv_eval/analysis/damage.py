"""Per-layer damage: the fidelity loss of compressing one layer alone, for every layer, from one prefill.

The damage of layer ``l`` at budget ``b`` is ``fidelity_kl`` (as :mod:`ripplekv_eval.running.rows` computes it)
of a cache where only layer ``l`` is compressed by SnapKV at ``b``. kvpress compresses after each layer's attention,
so that cache is the full cache with layer ``l`` spliced from the uniform SnapKV cache, derived once per budget
(tested against a real prefill that compresses layer ``l`` alone). Per prompt and budget: one derivation and
``layers + 1`` teacher-forced passes (the +1: all layers compressed, for reference).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.inference.generate import Prefill, eos_ids, extend, greedy_decode
from ripplekv.models.attention import enable_varlen_attention
from ripplekv.models.cache import KVPair, cache_from_tensors, cache_tensors
from ripplekv.models.headwise import headwise_of
from ripplekv.presses.registry import make_press
from ripplekv_eval.fastpath.derive import NotDerivableError, compressed_prefill
from ripplekv_eval.fastpath.fidelity import fidelity, teacher_forced_logprobs
from ripplekv_eval.fastpath.hidden_tail import hidden_states_tail, is_derivable
from ripplekv_eval.fastpath.record import PrefillRecord, record_prefill
from ripplekv_eval.running.budget_rows import budget_value, row_budget
from ripplekv_eval.running.config import EvalConfig
from ripplekv_eval.running.rows import greedy_agreement
from ripplekv_eval.sample import MIN_NEW_TOKENS, EvalSample

DAMAGE_METHOD = "snapkv"  # the method whose compression of one layer is measured


def uniform_compressed(record: PrefillRecord, press: BasePress) -> list[KVPair]:
    """Every layer's ``(keys, values)`` under ``press``: derived from ``record`` (no model pass), or the press's own
    prefill of the record's prompt where the fast path does not derive it
    (:func:`~ripplekv_eval.fastpath.derive.compressed_prefill`).

    Raises:
        NotDerivableError: for a press that masks keys head-wise (AdaKV): its layers cannot be spliced.
    """
    cache = compressed_prefill(record, press).cache
    if any(headwise_of(layer) is not None for layer in cache.layers):
        raise NotDerivableError(
            f"{type(press).__name__} masks keys head-wise: its layers cannot be spliced into the full cache"
        )
    return cache_tensors(cache)


def single_layer_cache(record: PrefillRecord, compressed: Sequence[KVPair], layer: int) -> DynamicCache:
    """The full cache of ``record`` with layer ``layer`` replaced by ``compressed[layer]`` (tensors by reference)."""
    if len(compressed) != len(record.layers):
        raise ValueError(f"{len(compressed)} compressed layers for a record of {len(record.layers)}")
    if not 0 <= layer < len(record.layers):
        raise ValueError(f"layer {layer} does not exist: the record has {len(record.layers)} layers")
    pairs = [(entry.keys, entry.values) for entry in record.layers]
    pairs[layer] = compressed[layer]
    return cache_from_tensors(pairs)


@dataclass(frozen=True)
class LayerDamage:
    """The damage of compressing each layer alone at one budget, on one prompt."""

    kl: tuple[float, ...]  # per layer, mean KL(full || only that layer compressed) over the answer, nats
    top1: tuple[float, ...]  # per layer, top1_agreement of that cache
    uniform_kl: float  # every layer compressed, for reference
    uniform_top1: float
    kept: int  # tokens the compressed layer keeps


def layer_damage(
    model: PreTrainedModel,
    record: PrefillRecord,
    press: BasePress,
    reference: torch.Tensor,
    tokens: Sequence[int],
    stop_ids: set[int],
    question: Sequence[int] = (),
) -> LayerDamage:
    """The damage of compressing each layer of ``record``'s prompt alone with ``press``, against ``reference`` (the
    full cache's log-probabilities of ``tokens``); ``question``: run over each cache first (query-agnostic)."""
    compressed = uniform_compressed(record, press)
    suffix = torch.tensor([list(question)], dtype=torch.long) if question else None

    def score(cache: DynamicCache) -> tuple[float, float]:
        state = Prefill(cache, record.next_logits, record.prompt_tokens, 0.0)
        if suffix is not None:
            state = extend(model, state, suffix)
        candidate = teacher_forced_logprobs(model, state, tokens)
        return fidelity(reference, candidate, tokens).kl, greedy_agreement(candidate, tokens, stop_ids)

    kl: list[float] = []
    top1: list[float] = []
    for layer in range(len(record.layers)):
        layer_kl, layer_top1 = score(single_layer_cache(record, compressed, layer))
        kl.append(layer_kl)
        top1.append(layer_top1)
    uniform_kl, uniform_top1 = score(cache_from_tensors(compressed))
    return LayerDamage(tuple(kl), tuple(top1), uniform_kl, uniform_top1, int(compressed[0][0].shape[2]))


class DamageRunner:
    """Per-layer damage rows of one sample at a time (its prefill and answer shared by every budget)."""

    def __init__(self, config: EvalConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.config = config
        self.model = enable_varlen_attention(model)
        self.tokenizer = tokenizer
        self.eos = eos_ids(model, tokenizer)
        self.full = make_press("full")
        self.presses = {
            float(b): make_press(DAMAGE_METHOD, **row_budget(b).kwargs(), window_size=config.window_size)
            for b in config.budget_values
        }

    def run_sample(
        self, sample: EvalSample, budgets: Sequence[float], answer: Sequence[int] | None = None
    ) -> Iterator[dict[str, Any]]:
        """One row per budget for ``sample`` (fields: :mod:`ripplekv_eval.analysis.runner`); ``answer``: stored by an
        earlier run (decoded again when None)."""
        prefix, question = sample.split(self.config.protocol)
        ids = torch.tensor([list(prefix)], dtype=torch.long)
        derived = [press for press in (self.full, *self.presses.values()) if is_derivable(press)]
        record = record_prefill(self.model, ids, hidden_states_tail(derived))
        full = compressed_prefill(record, self.full)
        if question:
            full = extend(self.model, full, torch.tensor([list(question)], dtype=torch.long))
        stops = self.eos | sample.extra_stop_ids
        tokens = list(answer) if answer else None
        if not tokens:
            tokens = greedy_decode(self.model, full, sample.max_new_tokens, stops, min_new_tokens=MIN_NEW_TOKENS)
        reference = teacher_forced_logprobs(self.model, full, tokens)
        for budget in budgets:
            started = time.perf_counter()
            try:
                damage = layer_damage(
                    self.model, record, self.presses[float(budget)], reference, tokens, stops, question
                )
            except ValueError as err:
                raise ValueError(f"sample {sample.id}, budget {budget}: {err}") from err
            yield {
                "sample_id": sample.id,
                "task": sample.task,
                "method": DAMAGE_METHOD,
                "budget": budget_value(budget),
                "prompt_tokens": len(sample.input_ids),
                "compressed_tokens": len(prefix),
                "kept_tokens": damage.kept,
                "damage_kl": list(damage.kl),
                "damage_top1": list(damage.top1),
                "uniform_kl": damage.uniform_kl,
                "uniform_top1": damage.uniform_top1,
                "answer_tokens": len(tokens),
                "answer_ids": tokens,
                "seconds": round(time.perf_counter() - started, 4),
                "prefill_seconds": round(record.seconds, 4),
                "meta": dict(sample.meta),
            }
