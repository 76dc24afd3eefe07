"""The result rows of one sample: one recorded prefill, the full cache's answer, then every configuration.

One row per (sample, configuration, budget), written to ``results.jsonl``; a configuration is a method under a
token scorer (:func:`~ripplekv_eval.sample.row_configuration`):

==================  =====================================================================================
``sample_id``       the sample (unique in the run); ``task``: its task
``method``          the method (its budget schedule); ``budget``: its budget (1.0 for ``full``)
``scorer``          the token scorer's name (:mod:`ripplekv.presses.scorers`); null for a method without one
``params``          a parameterised method's values (a RippleKV method's: the ``r`` and ``gamma`` that ran);
                    ``setting_source``: where a RippleKV method's came from (``profile``: the profile's chosen
                    setting, ``explicit``: given in the method's name, ``default``: r 4, gamma 3)
``prediction``      the decoded answer text; null for compressed configurations under ``--score fidelity``
``score``           the suite's metric on ``prediction`` (higher is better); null where ``prediction`` is
``prompt_tokens``   tokens of the whole prompt; ``compressed_tokens``: of the part that was compressed
``kept_tokens``     tokens kept per layer (AdaKV: head-wise masked keys not counted)
``kv_fraction``     ``sum(kept_tokens) / (layers * compressed_tokens)``
``generated_tokens`` tokens decoded for ``prediction`` (0 where it is null)
``fidelity_kl``     mean KL(full || method) in nats over the full cache's answer (0.0 for ``full``; lower is better)
``top1_agreement``  fraction of that answer's positions where the method's greedy choice is the full cache's
                    token (1.0 for ``full``; higher is better)
``gold_nll``        mean NLL of the suite's gold answer teacher-forced over the method's cache (null: no gold)
``gold_nll_delta``  ``gold_nll`` minus the full cache's on the same sample (0.0 for ``full``; lower is better)
``answer_tokens``   length of the full cache's answer (its final stop token included when it has one)
``answer_ids``      that answer's token ids, in the ``full`` row only (a resumed run reuses them)
``seconds``         wall time of this configuration (derivation, question, teacher forcing, decoding; a row decoded
                    in a batch counts its share, the batch's decoding time over its rows)
``decode_rows``     configurations decoded together with this one in one batch, its group (``--decode-rows`` and
                    ``--decode-memory`` bound it; 1 where caches cannot be batched); absent under
                    ``--decode sequential`` and where nothing was decoded
``prefill_seconds`` wall time of the sample's shared prefill; ``shared_prefill``: whether this row's cache was
                    derived from it (false: a press the fast path does not derive, run by its own prefill)
``meta``            the sample's metadata (LongBench length, needle depth, ...)
==================  =====================================================================================

Memory: every pass runs over lean forks that never copy the record (:func:`~ripplekv.models.cache.lean_fork`); under
batched decoding each configuration is laid out as a decode row (its cache released) and a group is decoded before
the next row would take it over ``--decode-rows`` rows or ``--decode-memory`` bytes (default: one full cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from kvpress.presses.base_press import BasePress
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ripplekv.inference.generate import Prefill, cache_forward, eos_ids, greedy_decode, kept_tokens
from ripplekv.models.attention import uses_varlen_attention
from ripplekv.models.cache import cache_bytes, lean_fork
from ripplekv.presses.method_spec import parse_method
from ripplekv.presses.registry import METHODS_WITHOUT_SCORER
from ripplekv.presses.ripplekv_press import press_setting
from ripplekv_eval.fastpath.batched import (
    DecodeRow,
    NotBatchableError,
    batched_greedy_decode_rows,
    decode_row,
    row_bytes,
)
from ripplekv_eval.fastpath.derive import (
    NotDerivableError,
    compressed_prefill,
    recorded_statistics,
    residual_statistics_of,
)
from ripplekv_eval.fastpath.fidelity import fidelity, mean_nll, teacher_forced_logprobs
from ripplekv_eval.fastpath.hidden_tail import PER_PROMPT, hidden_states_tail, is_derivable, prescored_scorers
from ripplekv_eval.fastpath.record import PrefillRecord, record_prefill
from ripplekv_eval.running.config import FULL_BUDGET, EvalConfig
from ripplekv_eval.sample import DEFAULT_SCORER, MIN_NEW_TOKENS, EvalSample, split_configuration
from ripplekv_eval.suites import encode


@torch.no_grad()
def lean_extend(model: PreTrainedModel, state: Prefill, input_ids: torch.Tensor) -> Prefill:
    """:func:`~ripplekv.inference.generate.extend` over a :func:`~ripplekv.models.cache.lean_fork` (same logits;
    ``state`` unchanged): the new ``(1, n)`` tokens are kept apart from ``state``'s tensors, held by reference."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"expected new tokens of shape (1, n), n >= 1, got {tuple(input_ids.shape)}")
    start = state.prompt_tokens
    positions = torch.arange(start, start + input_ids.shape[1], device=state.next_logits.device)
    cache = lean_fork(state.cache)
    start = time.perf_counter()
    logits = cache_forward(model, input_ids.to(positions.device), cache, positions, logits_to_keep=1)
    seconds = state.seconds + time.perf_counter() - start
    return Prefill(cache, logits[0, -1], int(positions[-1]) + 1, seconds)


def greedy_agreement(
    candidate: torch.Tensor, tokens: Sequence[int], stop_ids: set[int], min_new_tokens: int = MIN_NEW_TOKENS
) -> float:
    """Fraction of positions where greedy decoding over ``candidate`` (teacher-forced log-probabilities) picks
    ``tokens[i]``: the argmax, stop ids excluded at the first ``min_new_tokens`` positions as
    :func:`~ripplekv.inference.generate.greedy_decode` excludes them."""
    if candidate.dim() != 2 or candidate.shape[0] != len(tokens) or not tokens:
        raise ValueError(f"candidate of shape {tuple(candidate.shape)} does not match {len(tokens)} tokens")
    banned = sorted(i for i in stop_ids if 0 <= i < candidate.shape[-1])
    head = candidate[:min_new_tokens].clone()
    if banned:
        head[:, banned] = float("-inf")
    picks = torch.cat([head.argmax(dim=-1), candidate[min_new_tokens:].argmax(dim=-1)])
    return float((picks == torch.tensor(list(tokens), device=picks.device)).to(torch.float64).mean())


def layer_statistics(press: BasePress, record: PrefillRecord, model: PreTrainedModel) -> list[list[float]] | None:
    """The per-layer statistics a derived per-prompt press allocated from on ``record`` (the rule's fields per
    compressed layer) when every field is a number (not DynamicKV's score tensors), else None: a reader checks a
    row's budgets against its rule (``benchmarks/squeeze_optimality.py``)."""
    if type(press) not in PER_PROMPT or not is_derivable(press):
        return None
    out = []
    stats = recorded_statistics(press, record.layers, model.config, record.memo)  # type: ignore[arg-type]
    for stat in stats:
        fields = list(stat) if isinstance(stat, tuple) else [stat]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fields):
            return None
        out.append([float(v) for v in fields])
    return out


@dataclass(frozen=True)
class _Pending:
    """A configuration scored by teacher forcing, laid out for a batch, waiting for its group's decoding."""

    method: str
    budget: float
    row: DecodeRow
    kept: list[int]
    scores: dict[str, float | None]
    seconds: float  # wall time spent on it so far (derivation, question, teacher forcing, layout)


class SampleRunner:
    """Runs the pending configurations of one sample at a time (see :mod:`ripplekv_eval.running.runner`).

    ``presses``: the press of every (configuration, budget) and of ``("full", 1.0)``; ``on_group``: called with the
    bytes of each group of decode rows before it is decoded (tests and measurements).
    """

    def __init__(
        self,
        config: EvalConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        presses: dict[tuple[str, float], BasePress],
        on_group: Callable[[int], None] | None = None,
    ) -> None:
        if ("full", FULL_BUDGET) not in presses:
            raise ValueError("presses must hold the full cache's press, ('full', 1.0)")
        self.on_group = on_group
        derived = [press for press in presses.values() if is_derivable(press)]  # the others run their own prefill
        self.prescore = prescored_scorers(derived)  # scored while recording (ExpectedAttention)
        self.hidden_tail = hidden_states_tail(derived, self.prescore)  # what the presses read of them
        self.residual_statistics = residual_statistics_of(derived)  # per-prompt rules of the residual
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.presses = presses
        self.eos = eos_ids(model, tokenizer)
        self.n_layers = model.config.get_text_config().num_hidden_layers
        self.statistics: dict[tuple[str, float], list[list[float]] | None] = {}
        """The per-layer statistics of the last sample's per-prompt configurations (rows' ``layer_statistics``)."""

    def _with_question(self, sample: EvalSample, state: Prefill) -> Prefill:
        """Query-agnostic: run the question over the (compressed) context; question-aware: ``state`` as is."""
        tail = sample.split(self.config.protocol)[1]
        return lean_extend(self.model, state, torch.tensor([list(tail)], dtype=torch.long)) if tail else state

    def _compressed(self, sample: EvalSample, method: str, budget: float, record: PrefillRecord) -> Prefill:
        """The configuration's compressed prefill of the record's prompt (:func:`~ripplekv_eval.fastpath.derive.
        compressed_prefill`: derived from the record, or the press's own prefill)."""
        press = self.presses[method, budget]
        try:
            return compressed_prefill(record, press)
        except NotDerivableError as err:
            raise ValueError(
                f"sample {sample.id}, {method} at budget {budget}: its cache cannot be derived from the shared "
                f"prefill ({err})"
            ) from err
        except ValueError as err:
            raise ValueError(f"sample {sample.id}, {method} at budget {budget}: {err}") from err

    def _logprobs(self, state: Prefill, tokens: Sequence[int]) -> torch.Tensor:
        return teacher_forced_logprobs(self.model, state, tokens, fork=lean_fork)

    def _decode(self, sample: EvalSample, state: Prefill) -> list[int]:
        stops = self.eos | sample.extra_stop_ids
        return greedy_decode(self.model, state, sample.max_new_tokens, stops, MIN_NEW_TOKENS, fork=lean_fork)

    def run_sample(
        self, sample: EvalSample, pending: Sequence[tuple[str, float]], answer: Sequence[int] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Rows of the ``pending`` (method, budget) pairs of ``sample``, the ``full`` row first; ``answer``: the full
        cache's answer stored by an earlier run (decoded again when None)."""
        prefix = sample.split(self.config.protocol)[0]
        ids = torch.tensor([list(prefix)], dtype=torch.long)
        record = record_prefill(
            self.model, ids, self.hidden_tail, self.residual_statistics, self.config.prefill_chunk, self.prescore
        )
        prefill_seconds = record.seconds
        started = time.perf_counter()
        full = self._compressed(sample, "full", FULL_BUDGET, record)
        full_kept = kept_tokens(full)
        full = self._with_question(sample, full)
        tokens = list(answer) if answer else self._decode(sample, full)
        reference = self._logprobs(full, tokens)
        gold = encode(self.tokenizer, sample.gold) if sample.gold else []
        full_gold_nll = mean_nll(self._logprobs(full, gold), gold) if gold else None
        common: dict[str, Any] = {"prompt_tokens": len(sample.input_ids), "compressed_tokens": len(prefix)}
        common.update(answer_tokens=len(tokens), prefill_seconds=prefill_seconds)
        if ("full", FULL_BUDGET) in pending:
            prediction = self.tokenizer.decode(tokens, skip_special_tokens=True)
            scores = {"kl": 0.0, "top1": 1.0, "gold_nll": full_gold_nll, "delta": 0.0 if gold else None}
            row = self._row(sample, "full", FULL_BUDGET, prediction, tokens, full_kept, scores, common, started)
            yield {**row, "answer_ids": tokens}
        stops = self.eos | sample.extra_stop_ids
        asked = self.config.score == "both" and self.config.decode == "batched"
        # a ragged batch needs ripplekv's attention (FlashAttention as loaded decodes each cache alone: rows of 1)
        batched = asked and uses_varlen_attention(self.model)
        bound = self.config.decode_memory or cache_bytes(record.full_cache())
        group: list[_Pending] = []
        others = [(method, budget) for method, budget in pending if method != "full"]
        for index, (method, budget) in enumerate(others):
            started = time.perf_counter()
            state = self._compressed(sample, method, budget, record)
            press = self.presses[method, budget]
            self.statistics[method, budget] = layer_statistics(press, record, self.model)
            if index == len(others) - 1:  # the last derivation: the record (and the full cache) can go
                del record, full
            kept = kept_tokens(state)
            state = self._with_question(sample, state)
            candidate = self._logprobs(state, tokens)
            scores = {
                "kl": fidelity(reference, candidate, tokens).kl,
                "top1": greedy_agreement(candidate, tokens, stops),
                "gold_nll": None,
                "delta": None,
            }
            del candidate
            if gold:
                scores["gold_nll"] = mean_nll(self._logprobs(state, gold), gold)
                scores["delta"] = scores["gold_nll"] - full_gold_nll
            if batched:
                try:
                    size = row_bytes(state, sample.max_new_tokens)
                except NotBatchableError:
                    size = None
                held = sum(item.row.nbytes() for item in group)
                if group and (size is None or held + size > bound):
                    yield from self._decode_group(sample, group, common)  # released before the next row is built
                    group = []
                if size is not None:
                    row = decode_row(state, sample.max_new_tokens)
                    del state  # the row holds what the batch needs
                    group.append(_Pending(method, budget, row, kept, scores, time.perf_counter() - started))
                    if len(group) == self.config.decode_rows:
                        yield from self._decode_group(sample, group, common)
                        group = []
                    continue
            decoded = self._decode(sample, state) if self.config.score == "both" else None
            del state
            prediction = None if decoded is None else self.tokenizer.decode(decoded, skip_special_tokens=True)
            row = self._row(sample, method, budget, prediction, decoded, kept, scores, common, started)
            yield {**row, "decode_rows": 1} if asked else row
        if group:
            yield from self._decode_group(sample, group, common)

    def _decode_group(
        self, sample: EvalSample, group: Sequence[_Pending], common: dict[str, Any]
    ) -> Iterator[dict[str, Any]]:
        """Rows of configurations whose decode rows decode as one batch (``decode_rows``: the group's size)."""
        if self.on_group is not None:
            self.on_group(sum(item.row.nbytes() for item in group))
        stops = self.eos | sample.extra_stop_ids
        start = time.perf_counter()
        rows = [item.row for item in group]
        answers = batched_greedy_decode_rows(self.model, rows, sample.max_new_tokens, stops, MIN_NEW_TOKENS)
        del rows
        share = (time.perf_counter() - start) / len(group)  # each row's part of the batch's decoding time
        for item, decoded in zip(group, answers):
            prediction = self.tokenizer.decode(decoded, skip_special_tokens=True)
            started = time.perf_counter() - item.seconds - share
            row = self._row(
                sample, item.method, item.budget, prediction, decoded, item.kept, item.scores, common, started
            )
            yield {**row, "decode_rows": len(group)}

    def _row(
        self,
        sample: EvalSample,
        configuration: str,
        budget: float,
        prediction: str | None,
        decoded: list[int] | None,
        kept: list[int],
        scores: dict[str, float | None],
        common: dict[str, Any],
        started: float,
    ) -> dict[str, Any]:
        method, scorer = split_configuration(configuration)
        spec = parse_method(method)
        extra: dict[str, Any] = {"params": spec.values} if spec.values else {}
        applied = press_setting(self.presses[configuration, budget])
        if applied is not None:  # the r and gamma that ran, and where they came from
            extra = {"params": {**spec.values, "r": applied.ratio, "gamma": applied.gamma}}
            extra["setting_source"] = applied.source
        statistics = self.statistics.get((configuration, budget))
        if statistics is not None:
            extra["layer_statistics"] = statistics
        return {
            "sample_id": sample.id,
            "task": sample.task,
            "method": method,
            "scorer": None if spec.name in METHODS_WITHOUT_SCORER else scorer or DEFAULT_SCORER,
            **extra,
            "budget": budget,
            "prediction": prediction,
            "score": None if prediction is None else float(sample.score(prediction)),
            "prompt_tokens": common["prompt_tokens"],
            "compressed_tokens": common["compressed_tokens"],
            "kept_tokens": kept,
            "kv_fraction": round(sum(kept) / (self.n_layers * common["compressed_tokens"]), 6),
            "generated_tokens": 0 if decoded is None else len(decoded),
            "fidelity_kl": scores["kl"],
            "top1_agreement": scores["top1"],
            "gold_nll": scores["gold_nll"],
            "gold_nll_delta": scores["delta"],
            "answer_tokens": common["answer_tokens"],
            "seconds": round(time.perf_counter() - started, 4),
            "prefill_seconds": round(common["prefill_seconds"], 4),
            "shared_prefill": is_derivable(self.presses[configuration, budget]),
            "meta": dict(sample.meta),
        }
