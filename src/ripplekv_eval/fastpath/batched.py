"""Decode (or teacher-force) every compressed cache of one prompt as one batch.

A small model's CPU decoding step is mostly fixed cost, so the caches derived from one prefill run together, laid
out by :mod:`ripplekv_eval.fastpath.batch_layout`: decoding as a ragged batch (attention row by row over each row's
own entries; padding was slower, docs/results.md), teacher forcing as padded batches. Tokens equal
:func:`~ripplekv.inference.generate.greedy_decode` per cache up to float rounding at near-ties; one host sync a step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from ripplekv.inference.generate import Prefill, cache_forward
from ripplekv.models.attention import unsupported_implementation_message, uses_varlen_attention
from ripplekv.models.cache import cache_from_layers
from ripplekv_eval.fastpath.batch_layout import (
    STEP_COST_TOKENS,
    DecodeRow,
    NotBatchableError,
    check_count,
    check_rows,
    check_states,
    decode_row,
    padded_batch,
    plan_batches,
    ragged_batch,
    ragged_cache_of,
    row_bytes,
)
from ripplekv_eval.fastpath.fidelity import teacher_forced_logprobs

__all__ = [
    "batched_greedy_decode",
    "batched_greedy_decode_rows",
    "batched_teacher_forced_logprobs",
    "can_batch",
    # re-exported, imported from here across the package: the layout of the batches (batch_layout)
    "STEP_COST_TOKENS",
    "DecodeRow",
    "NotBatchableError",
    "decode_row",
    "padded_batch",
    "plan_batches",
    "ragged_batch",
    "row_bytes",
]


@torch.no_grad()
def batched_greedy_decode(
    model: PreTrainedModel,
    states: Sequence[Prefill],
    max_new_tokens: int,
    stop_ids: set[int],
    min_new_tokens: int = 0,
    max_rows: int | None = None,
) -> list[list[int]]:
    """Greedy tokens after each of ``states`` (left unchanged), decoded as one batch per ``max_rows`` rows.

    Row ``i`` is ``greedy_decode(model, states[i], max_new_tokens, stop_ids, min_new_tokens)`` up to float rounding
    at near-ties; a row leaves the batch at a stop token (included) or ``max_new_tokens``. Stop ids cannot be chosen
    for a row's first ``min_new_tokens`` tokens. ``max_rows`` (None: no limit) bounds the memory of the batch.

    Raises:
        NotBatchableError: the caches, or a model not running ripplekv's attention functions
            (:func:`ripplekv.models.attention.enable_varlen_attention`; FlashAttention, kept as loaded, would attend
            each row over its new token only), cannot decode as one batch: decode each cache alone instead.
    """
    if not uses_varlen_attention(model):
        raise NotBatchableError(unsupported_implementation_message(model, "batched decoding"))
    check_count("max_new_tokens", max_new_tokens, 1)
    check_count("min_new_tokens", min_new_tokens, 0)
    check_states(states)
    check_count("max_rows", max_rows, 1) if max_rows is not None else None
    size = len(states) if max_rows is None else max_rows
    results: list[list[int]] = []
    for start in range(0, len(states), size):
        rows = [decode_row(state, max_new_tokens) for state in states[start : start + size]]
        results.extend(batched_greedy_decode_rows(model, rows, max_new_tokens, stop_ids, min_new_tokens))
    return results


@torch.no_grad()
def batched_greedy_decode_rows(
    model: PreTrainedModel,
    rows: Sequence[DecodeRow],
    max_new_tokens: int,
    stop_ids: set[int],
    min_new_tokens: int = 0,
) -> list[list[int]]:
    """:func:`batched_greedy_decode` over rows built by :func:`decode_row` (each with room for ``max_new_tokens``)."""
    if not can_batch(model):
        raise NotBatchableError(unsupported_implementation_message(model, "batched decoding"))
    check_count("max_new_tokens", max_new_tokens, 1)
    check_count("min_new_tokens", min_new_tokens, 0)
    check_rows(rows, max_new_tokens)
    return _decode_batch(model, rows, max_new_tokens, stop_ids, min_new_tokens)


def can_batch(model: PreTrainedModel) -> bool:
    """Whether ``model`` runs ripplekv's attention functions, which alone read a ragged batch.

    Check it before laying caches out as decode rows: a row cannot fall back to decoding alone.
    """
    return uses_varlen_attention(model)


def _decode_batch(
    model: PreTrainedModel, rows: Sequence[DecodeRow], max_new_tokens: int, stop_ids: set[int], min_new_tokens: int
) -> list[list[int]]:
    cache = ragged_cache_of(rows)
    logits = torch.stack([row.next_logits for row in rows])
    device, vocab = logits.device, logits.shape[-1]
    banned = torch.tensor(sorted(i for i in stop_ids if 0 <= i < vocab), dtype=torch.long, device=device)
    tokens: list[list[int]] = [[] for _ in rows]
    active = list(range(len(rows)))
    position = rows[0].prompt_tokens
    while True:
        if len(tokens[active[0]]) < min_new_tokens and banned.numel():
            logits = logits.index_fill(-1, banned, float("-inf"))
        picks = logits.argmax(dim=-1).tolist()
        staying = []
        for slot, (row, token) in enumerate(zip(active, picks)):
            tokens[row].append(int(token))
            if token not in stop_ids and len(tokens[row]) < max_new_tokens:
                staying.append(slot)
        if not staying:
            return tokens
        if len(staying) < len(active):
            cache = cache_from_layers([layer.select(staying) for layer in cache.layers])
            active = [active[slot] for slot in staying]
        step = torch.tensor([[tokens[row][-1]] for row in active], device=device)
        pos = torch.tensor([position], device=device)
        logits = cache_forward(model, step, cache, pos)[:, -1]
        position += 1


@torch.no_grad()
def batched_teacher_forced_logprobs(
    model: PreTrainedModel, states: Sequence[Prefill], tokens: Sequence[int], max_rows: int | None = None
) -> list[torch.Tensor]:
    """:func:`~ripplekv_eval.fastpath.fidelity.teacher_forced_logprobs` of the same ``tokens`` over each of ``states``.

    One forward pass of ``tokens[:-1]`` per padded batch (:func:`plan_batches`, at most ``max_rows`` rows; a pass's
    logits take ``rows * len(tokens) * vocab`` floats). A model without ripplekv's attention functions is
    teacher-forced one cache at a time, the same exact computation.

    Returns:
        Per state, ``(len(tokens), vocab)`` float64 log-softmax on the CPU.
    """
    if not states:
        raise ValueError("no caches to teacher-force")
    if not uses_varlen_attention(model):
        return [teacher_forced_logprobs(model, state, tokens) for state in states]
    check_states(states)
    vocab = states[0].next_logits.shape[-1]
    ids = [int(t) for t in tokens]
    if not ids or any(not 0 <= t < vocab for t in ids):
        raise ValueError(f"tokens must be a non-empty sequence of ids in [0, {vocab})")
    results: list[torch.Tensor | None] = [None] * len(states)
    for batch in plan_batches(states, max_rows):
        group = [states[i] for i in batch]
        first = torch.stack([state.next_logits for state in group]).to("cpu", torch.float64).unsqueeze(1)
        if len(ids) == 1:
            rest = first.new_zeros((len(group), 0, vocab))
        else:
            cache, validity = padded_batch(group)
            device = group[0].next_logits.device
            start = group[0].prompt_tokens
            positions = torch.arange(start, start + len(ids) - 1, device=device)
            ids_rows = torch.tensor([ids[:-1]], device=device).expand(len(group), -1)
            logits = cache_forward(model, ids_rows, cache, positions, key_validity=validity)
            rest = logits.to("cpu", torch.float64)
        for index, logprobs in zip(batch, torch.log_softmax(torch.cat([first, rest], dim=1), dim=-1).unbind(0)):
            results[index] = logprobs
    return results  # type: ignore[return-value]
